"""Airflow 3: a three-step pipeline that streams through Sluice.

Three KubernetesPodOperator tasks, produce -> filter -> reduce, with no dependency
between them: Airflow's scheduler starts them together (under an executor that runs tasks
at once, such as the LocalExecutor or the KubernetesExecutor), and Sluice makes each
reader's reads wait for exactly the bytes its producer has written. The labels put each
pod into a step of the Sluice Workflow named by the run's params (workflow.yaml, applied
first in the run's namespace); Sluice's webhook adds the sidecar and the volume at /data.

Params of a run (airflow dags trigger sluice_pipeline --conf '{"namespace": "ns"}'):
  namespace  where the pods run and the Workflow is (default "default")
  workflow   the Sluice Workflow's name (default "pipeline")
  fail       a step name: that step exits 1 halfway, to see a failure end the run
             (default "": none)

The image and its pull policy come from the environment of the scheduler's processes,
SLUICE_RECIPE_IMAGE (default busybox:1.36) and SLUICE_RECIPE_PULL_POLICY (default
IfNotPresent); the e2e suite runs this file as it is with its cluster's local image.
Pods are found through the scheduler's kubeconfig (KUBECONFIG) or, inside a cluster,
its service account (the provider's kubernetes_default connection).
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

with DAG(
    "sluice_pipeline",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    params={
        "namespace": Param("default", type="string"),
        "workflow": Param("pipeline", type="string"),
        "fail": Param("", type="string"),
    },
    tags=["sluice"],
):
    for step, script in STEPS.items():
        KubernetesPodOperator(
            task_id=step,
            name=step,
            namespace="{{ params.namespace }}",
            image=IMAGE,
            image_pull_policy=PULL_POLICY,
            cmds=["sh", "-c", "set -eu -o pipefail\n" + script],
            env_vars={"FAIL": "{{ params.fail }}"},
            # The Sluice opt-in, as labels (annotations work as well).
            labels={
                "sluice.io/inject": "true",
                "sluice.io/workflow": "{{ params.workflow }}",
                "sluice.io/step": step,
            },
            get_logs=True,
            startup_timeout_seconds=300,
        )
    # No produce >> filter >> reduce: the three run at once and stream. With those edges
    # Airflow would run them one after the other, each reading a finished file.
