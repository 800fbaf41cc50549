"""The three steps of the Airflow recipes (pipeline_dag.py, sequential_dag.py): their
shell commands and the KubernetesPodOperator task that runs one. Not a DAG file itself;
the DAG files import it (Airflow puts the DAG folder on the path).

The image and its pull policy come from the environment of the scheduler's processes,
SLUICE_RECIPE_IMAGE (default busybox:1.36) and SLUICE_RECIPE_PULL_POLICY (default
IfNotPresent); the e2e suite runs these files as they are with its cluster's local image.
"""
import os
from datetime import datetime

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk import DAG, Param

# Each step's shell commands (busybox sh). STEPS is read by the e2e suite too, which runs
# the same commands on a plain directory and compares the results byte for byte.
STEPS = {
    # 200000 lines in 40 chunks, 0.2 s apart: about 8 s of writing.
    "produce": """
i=0
while [ $i -lt 40 ]; do
  if [ "$FAIL" = produce ] && [ $i -eq 20 ]; then echo "produce: failing on purpose" >&2; exit 1; fi
  seq $((i * 5000 + 1)) $((i * 5000 + 5000))
  i=$((i + 1))
  sleep 0.2
done > /data/numbers.txt
date +%s > /data/produce.end
""",
    # The time its first line arrived, then every line holding a 7.
    "filter": """
exec < /data/numbers.txt
IFS= read -r first
date +%s > /data/filter.first
{ printf '%s\\n' "$first"; cat; } | grep 7 > /data/filtered.txt
if [ "$FAIL" = filter ]; then echo "filter: failing on purpose" >&2; exit 1; fi
""",
    # How many lines, the last three, and a checksum of them all.
    "reduce": """
{ wc -l < /data/filtered.txt; tail -n 3 /data/filtered.txt; md5sum < /data/filtered.txt; } > /data/result.txt
if [ "$FAIL" = reduce ]; then echo "reduce: failing on purpose" >&2; exit 1; fi
""",
}

IMAGE = os.environ.get("SLUICE_RECIPE_IMAGE", "busybox:1.36")
PULL_POLICY = os.environ.get("SLUICE_RECIPE_PULL_POLICY", "IfNotPresent")
START = datetime(2026, 1, 1)


def sluice_labels(step):
    """The Sluice opt-in of a step's pod, as labels (annotations work as well)."""
    return {
        "sluice.io/inject": "true",
        "sluice.io/workflow": "{{ params.workflow }}",
        "sluice.io/step": step,
    }


def step_task(step, **kwargs):
    """The KubernetesPodOperator task of step, running its STEPS commands; kwargs add to
    or replace its arguments (labels, volumes, node_selector)."""
    args = dict(
        task_id=step,
        name=step,
        namespace="{{ params.namespace }}",
        image=IMAGE,
        image_pull_policy=PULL_POLICY,
        cmds=["sh", "-c", "set -eu -o pipefail\n" + STEPS[step]],
        env_vars={"FAIL": "{{ params.fail }}"},
        get_logs=True,
        startup_timeout_seconds=300,
    )
    args.update(kwargs)
    return KubernetesPodOperator(**args)


def pipeline_dag(dag_id, **params):
    """A DAG of the pipeline, run by hand (no schedule), with the params every run takes
    (namespace, fail) and, as strings, those given (name=default)."""
    p = {"namespace": Param("default", type="string"), "fail": Param("", type="string")}
    p.update({name: Param(default, type="string") for name, default in params.items()})
    return DAG(dag_id, start_date=START, schedule=None, catchup=False, params=p, tags=["sluice"])
