"""Airflow 3: the pipeline of pipeline_dag.py run the way Airflow runs it without Sluice.

Two DAGs of the same three KubernetesPodOperator tasks with the same commands (STEPS of
pipeline_steps.py), each with Airflow's usual edges produce >> filter >> reduce, so that
each task starts only once the one before it has succeeded, and reads a finished file:

  sluice_pipeline_sequential  the files pass through Sluice's volume (the Workflow of
                              workflow.yaml), as in sluice_pipeline but one task at a time
  sluice_pipeline_hostpath    the files pass through a plain shared directory: a hostPath
                              volume (/var/tmp/sluice-airflow/<namespace>) on one node,
                              every task pinned there; no Sluice

Beside sluice_pipeline (the same tasks at once, streaming) they give the pipeline's
makespan three ways in one Airflow: the e2e suite runs all three and prints the figures
(README, "Workflow engines"). Params of a run are those of sluice_pipeline, and for
sluice_pipeline_hostpath the node whose directory the tasks share (its
kubernetes.io/hostname label) in place of the workflow.
"""
from kubernetes.client import models as k8s

from pipeline_steps import STEPS, pipeline_dag, sluice_labels, step_task


def chain(tasks):
    """Airflow's edges between the tasks, in order."""
    for before, after in zip(tasks, tasks[1:]):
        before >> after


with pipeline_dag("sluice_pipeline_sequential", workflow="pipeline"):
    chain([step_task(step, labels=sluice_labels(step)) for step in STEPS])

with pipeline_dag("sluice_pipeline_hostpath", node=""):
    # The provider renders a mount's sub_path, not a hostPath's path: one directory per
    # run's namespace beneath a fixed one (the kubelet makes it).
    chain([
        step_task(
            step,
            volumes=[k8s.V1Volume(name="data", host_path=k8s.V1HostPathVolumeSource(
                path="/var/tmp/sluice-airflow", type="DirectoryOrCreate"))],
            volume_mounts=[k8s.V1VolumeMount(name="data", mount_path="/data", sub_path="{{ params.namespace }}")],
            node_selector={"kubernetes.io/hostname": "{{ params.node }}"},
        )
        for step in STEPS
    ])
