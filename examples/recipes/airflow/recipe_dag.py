"""Airflow: two KubernetesPodOperator tasks without a dependency between them, so the
scheduler runs them together and Sluice makes the consumer's reads wait for the
producer's bytes. labels and annotations put each pod into a step of the Sluice Workflow
"recipe" (workflow.yaml); the webhook adds the sidecar and the volume at /data."""
from datetime import datetime

from airflow import DAG
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator


def sluice(step):
    return dict(labels={"sluice.io/inject": "true"},
                annotations={"sluice.io/workflow": "recipe", "sluice.io/step": step})


with DAG("recipe", start_date=datetime(2026, 1, 1), schedule=None, catchup=False):
    produce = KubernetesPodOperator(
        task_id="produce", name="produce", image="busybox:1.36",
        cmds=["sh", "-c", "seq 1 200000 > /data/numbers.txt"], **sluice("produce"))
    consume = KubernetesPodOperator(
        task_id="consume", name="consume", image="busybox:1.36",
        cmds=["sh", "-c", "awk '{s += $1} END {print s}' /data/numbers.txt > /data/sum-$SLUICE_INSTANCE.txt"],
        **sluice("consume"))
    # no produce >> consume: both run at once
