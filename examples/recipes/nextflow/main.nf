// Nextflow with the k8s executor: the two processes read and write /data, the Sluice
// volume the webhook mounts into their pods. They have no channel between them, so
// Nextflow runs them together and Sluice makes consume's reads wait for produce's bytes.
// The pod directive (nextflow.config) puts each task's pod into a step of the Sluice
// Workflow "recipe" (workflow.yaml).
process produce {
    pod label: 'sluice.io/inject', value: 'true'
    pod annotation: 'sluice.io/workflow', value: 'recipe'
    pod annotation: 'sluice.io/step', value: 'produce'
    script:
    'seq 1 200000 > /data/numbers.txt'
}

process consume {
    pod label: 'sluice.io/inject', value: 'true'
    pod annotation: 'sluice.io/workflow', value: 'recipe'
    pod annotation: 'sluice.io/step', value: 'consume'
    script:
    'awk \'{s += $1} END {print s}\' /data/numbers.txt > /data/sum-$SLUICE_INSTANCE.txt'
}

workflow {
    produce()
    consume()
}
