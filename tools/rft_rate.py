"""A recorded study cell's RFT control again, at GRPO's learning rate (`study.rft_at_grpos_rate`).

The recorded cells trained RFT at SFT's learning rate, ten times GRPO's, and on two of the published scarce seeds
it fell below the SFT model it started from; this trains the cell's SFT again, then RFT for the cell's fixed steps
at GRPO's rate, and pairs RFT with the recorded SFT, GRPO and SFT control on the cell's 200 held-out problems.
Run it alone, under the environment that recorded the cell (`sft_answers_as_recorded` says whether the new SFT
model is the recorded one), e.g. for docs/study_cells_seeded/scarce-seed1.json, recorded on a 2-core Intel Xeon
under the stand-in of the time:

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 GRPO_KIT_CPU_BF16=0 python -m tools.rft_rate \\
        docs/study_cells_seeded/scarce-seed1.json --output-dir runs/rft-rate/scarce-seed1 \\
        --result docs/study_rft_rate/scarce-seed1.json

About 70 minutes alone on 2 cores (SFT 160 steps, RFT 107, two evaluations).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grpo_kit.train.checkpoint import write_whole
from tools.study import rft_at_grpos_rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.rft_rate", description=__doc__.split("\n")[0])
    parser.add_argument("record", help="a study cell's record (docs/study_cells*/<regime>-seed<n>.json)")
    parser.add_argument("--output-dir", required=True, help="where the arc goes (running again continues it)")
    parser.add_argument("--result", required=True, help="the JSON file the result is written to")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    result = rft_at_grpos_rate(args.record, args.output_dir, progress=not args.quiet)
    Path(args.result).parent.mkdir(parents=True, exist_ok=True)
    write_whole(Path(args.result), json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
