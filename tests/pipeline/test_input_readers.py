"""An input whose format has no reader for its kind (a chat dataset as Parquet, as Hugging Face ships many SFT sets)
is refused when the inputs are listed, naming the input and the file, before an engine starts. Before, the
run started Ray and failed inside a read task: ~150 lines of Ray tracebacks on stderr around the one line that says
what to do."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from tests.cli.conftest import datahub


def test_a_format_without_a_reader_for_the_kind_is_refused_before_the_run(tmp_path):
    data = tmp_path / "sft.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": [{"role": "user", "content": "hi"},
                                                       {"role": "assistant", "content": "hello"}]}]), data)
    job = tmp_path / "job.yaml"
    job.write_text(f"name: pq-chat\nlake: {{root: {tmp_path / 'lake'}}}\n"
                   f"inputs:\n  - {{uri: {tmp_path}/*.parquet, kind: chat}}\ngraph:\n  samples: {{sink: samples}}\n")
    for args in (["--check"], []):
        out = datahub("run", str(job), *args)
        assert out.returncode == 2, out.stdout
        assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
        assert (f"{job}: inputs.0: {data}: format 'parquet' has no reader for sample kind 'chat' (it reads: "
                "image_text, text)") in out.stderr, out.stderr
    assert not (tmp_path / "lake" / "runs").exists()  # nothing ran, no failed run recorded
