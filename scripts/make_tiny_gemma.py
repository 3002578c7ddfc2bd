"""Write the embedded tiny Gemma's and tiny Gemma 4's tokenizers (and their config.json) to
grpo_kit/assets/models/tiny-gemma/ and tiny-gemma-4/ (weights come from a seed).

Run: python scripts/make_tiny_gemma.py   (tests check the committed files equal what this writes)
"""

from grpo_kit.engine.hub import TINY_MODELS
from grpo_kit.engine.models import MODEL_SHAPES, write_tiny_gemma_files

if __name__ == "__main__":
    for name in TINY_MODELS:
        out = write_tiny_gemma_files(MODEL_SHAPES / name, name)
        print(f"wrote {sorted(p.name for p in out.iterdir())} to {out}")
