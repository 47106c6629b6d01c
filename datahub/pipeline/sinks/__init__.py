"""Sinks: where rows leave the graph.

- ``split``: what the samples sink does to each batch of graph output (``SampleSplitter``): live
  samples, quarantined records and lineage events (ingested, modified, annotated, dropped,
  quarantined), and their counts; plain pyarrow, run on the driver or in engine tasks.
- ``samples``: the samples sink (``drain_samples``). Engines whose tasks write the tables' files
  themselves (``Engine.write_split``: Spark's executors) do so; otherwise the batches reach the driver
  and go to local staging files (``staging``), copied into the tables' folders at commit time.
  Either way each table is then one idempotent commit of add actions with the run id as its Delta
  app transaction; ``--full``'s predicate overwrite streams the staged rows through delta-rs instead.
- ``side_outputs``: tables a global operator adds (e.g. ``minhash_index``), written by the engine's
  tasks through the write seam (``datahub.engines.sink.TableFilesSink``) and committed after the samples.
- ``stats``: the ``sink: stats`` branch, counts kept in the run record.
"""
