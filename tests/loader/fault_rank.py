"""One trainer rank for the fault-injection test: a DataLoader with workers over ReleaseDataset, gated.

``python -m tests.loader.fault_rank CONFIG.json`` reads the rank's share of the epoch and writes the sample ids
it got to ``CONFIG["out"]``. After ``count`` samples of each gate ``[count, path]`` it touches ``path + ".at"``
and waits for ``path`` to exist, so the test can break the storage at known points of the epoch while the
DataLoader workers keep reading. ``working_s`` is the rank's wall time minus the time spent waiting at gates.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

GATE_TIMEOUT_S = 300.0


def main(config_path: str) -> int:
    began = time.monotonic()
    config = json.loads(Path(config_path).read_text())
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(process)d %(name)s: %(message)s")
    from torch.utils.data import DataLoader

    from datahub.loader import ReadPolicy, ReleaseDataset

    dataset = ReleaseDataset(config["manifest"], storage=config["storage"], tier_preference=config["tiers"],
                             rank=config["rank"], world_size=config["world_size"], seed=7,
                             shuffle_buffer=config["shuffle_buffer"], read_policy=ReadPolicy(**config["read_policy"]),
                             prefetch_shards=config.get("prefetch_shards", 2))
    gates = {int(count): Path(path) for count, path in config["gates"]}
    ids: list[str] = []
    waited = 0.0
    loader = DataLoader(dataset, batch_size=None, num_workers=config["workers"])
    for sample in loader:
        if not sample["is_padding"]:
            ids.append(sample["sample_id"])
        gate = gates.get(len(ids))
        if gate is not None:
            Path(f"{gate}.at{config['rank']}").touch()
            start = time.monotonic()
            while not gate.exists():
                if time.monotonic() - start > GATE_TIMEOUT_S:
                    print(f"rank {config['rank']}: gate {gate} never opened", file=sys.stderr)
                    return 3
                time.sleep(0.02)
            waited += time.monotonic() - start
    Path(config["out"]).write_text(json.dumps({"ids": ids, "working_s": time.monotonic() - began - waited}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
