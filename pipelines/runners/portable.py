"""The engines Beam runs through its own job services: Flink and Spark
(job server jars, ``--flink_master`` / ``--spark_master_url``), Dataflow,
and any other runner Beam knows. dpsynth adds no runner class of its own
here: where the workers are is ``locality``'s question, the job servers'
binaries ``deploy/install_engines``'s."""

from __future__ import annotations

from dpsynth.pipelines.runners.engine import Engine


class PortableEngine(Engine):
    """Flink, Spark or another Beam runner, as Beam runs it."""

    name = "portable"


class DataflowEngine(Engine):
    """DataflowRunner: the service keeps the job graph (staging location,
    job metadata), so a noise key must not be pickled into it."""

    name = "dataflow"
    keeps_job_graph = True

    def job_graph_refusal(self) -> str:
        return ("DataflowRunner keeps the job graph in the staging location "
                "and the job's metadata, and a noise key pickled into it "
                "would let their readers remove the noise: pass "
                "--noise-key-location gs://BUCKET/PREFIX, readable only by "
                "the job's service account (the key is written there for "
                "the run and deleted after it)")
