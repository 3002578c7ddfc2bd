"""Write the embedded tiny Gemma's tokenizer (and its config.json) to grpo_kit/assets/models/tiny-gemma/
(weights come from a seed).

Run: python scripts/make_tiny_gemma.py   (tests check the committed files equal what this writes)
"""

from grpo_kit.engine.models import MODEL_SHAPES, write_tiny_gemma_files

if __name__ == "__main__":
    out = write_tiny_gemma_files(MODEL_SHAPES / "tiny-gemma")
    print(f"wrote {sorted(p.name for p in out.iterdir())} to {out}")
