"""JSONSchemaBench's real-world schemas, read from a folder of datasets, and the sample of them
this repository carries.

JSONSchemaBench (github.com/guidance-ai/jsonschemabench, folder data/; MIT) holds the ten
datasets of the benchmark paper (arXiv 2501.10868), one folder of plain schema files each
(9,558 schemas). data/jsonschemabench/ carries a seeded sample of every dataset (its README
says how it was drawn, with `vendor_sample`), so benches and tests run offline; the whole runs
from a clone:

    git clone https://github.com/guidance-ai/jsonschemabench /tmp/jsonschemabench
    pegmask bench schema_coverage --data /tmp/jsonschemabench/data

    python -m pegmask.bench.jsonschemabench SOURCE_DATA_DIR   # redraws the vendored sample
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

from pegmask.bench.data import DATA

SAMPLE_DIR = DATA / "jsonschemabench"
DATASETS = ("Github_easy", "Github_hard", "Github_medium", "Github_trivial", "Github_ultra",
            "Glaiveai2K", "JsonSchemaStore", "Kubernetes", "Snowplow", "WashingtonPost")
SAMPLE_SIZE = 30  # schemas per dataset in the vendored sample
SAMPLE_MAX_BYTES = 50_000  # larger files are left out of the sample (not of a full run)


def dataset_files(data_dir: Path = SAMPLE_DIR, per_dataset: int | None = None
                  ) -> dict[str, list[Path]]:
    """Each dataset folder of `data_dir` (a sub-folder holding `*.json` files) with its schema
    files in name order, the first `per_dataset` of each when given."""
    if not data_dir.is_dir():
        raise ValueError(f"{data_dir} is not a folder (JSONSchemaBench's data/ or a sample of it)")
    found = {}
    for folder in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        files = sorted(folder.glob("*.json"))
        if files:
            found[folder.name] = files[:per_dataset]
    if not found:
        raise ValueError(f"{data_dir} has no dataset folders of *.json schemas")
    return found


def read_schema(path: Path) -> str:
    """A schema file's JSON as compact text (key order kept), the form every engine compiles."""
    try:
        return json.dumps(json.loads(path.read_text(encoding="utf-8")), ensure_ascii=False)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a readable JSON file: {exc}") from exc


def vendor_sample(source: Path, dest: Path = SAMPLE_DIR, per_dataset: int = SAMPLE_SIZE,
                  max_bytes: int = SAMPLE_MAX_BYTES, seed: int = 0) -> dict[str, list[Path]]:
    """Copy, unchanged, `per_dataset` files of each dataset of `source` into `dest`: drawn with
    `random.Random(f"{seed}:{dataset}")` from the files of at most `max_bytes` bytes in name
    order, so that a dataset's draw does not depend on the others."""
    copied = {}
    for dataset, files in dataset_files(source).items():
        small = [p for p in files if p.stat().st_size <= max_bytes]
        chosen = sorted(random.Random(f"{seed}:{dataset}").sample(small,
                                                                  min(per_dataset, len(small))))
        (dest / dataset).mkdir(parents=True, exist_ok=True)
        copied[dataset] = [Path(shutil.copy2(p, dest / dataset / p.name)) for p in chosen]
    return copied


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Redraw the vendored JSONSchemaBench sample.")
    parser.add_argument("source", type=Path, help="JSONSchemaBench's data/ folder (a clone's)")
    parser.add_argument("--dest", type=Path, default=SAMPLE_DIR)
    parser.add_argument("--per-dataset", type=int, default=SAMPLE_SIZE)
    parser.add_argument("--max-bytes", type=int, default=SAMPLE_MAX_BYTES)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    copied = vendor_sample(args.source, args.dest, args.per_dataset, args.max_bytes, args.seed)
    for dataset, files in copied.items():
        print(f"{dataset}: {len(files)} files, {sum(p.stat().st_size for p in files):,} bytes")


if __name__ == "__main__":
    main()
