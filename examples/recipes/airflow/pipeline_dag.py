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

The steps' commands, image and task arguments are in pipeline_steps.py, shared with
sequential_dag.py (the same pipeline with Airflow's usual edges, to compare makespans).
Pods are found through the scheduler's kubeconfig (KUBECONFIG) or, inside a cluster,
its service account (the provider's kubernetes_default connection).
"""
from pipeline_steps import STEPS, pipeline_dag, sluice_labels, step_task

with pipeline_dag("sluice_pipeline", workflow="pipeline"):
    for step in STEPS:
        step_task(step, labels=sluice_labels(step))
    # No produce >> filter >> reduce: the three run at once and stream. With those edges
    # Airflow would run them one after the other, each reading a finished file
    # (sequential_dag.py).
