"""Write the embedded tiny Gemma's config and tokenizer to data/tiny_gemma/ (weights come from a seed).

Run: python scripts/make_tiny_gemma.py   (tests check the committed files equal what this writes)
"""

from pathlib import Path

from grpo_kit.models import write_tiny_gemma_files

if __name__ == "__main__":
    out = write_tiny_gemma_files(Path(__file__).resolve().parent.parent / "data" / "tiny_gemma")
    print(f"wrote {sorted(p.name for p in out.iterdir())} to {out}")
