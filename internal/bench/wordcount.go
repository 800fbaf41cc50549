package bench

import (
	_ "embed"

	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// wordcountYAML is examples/wordcount/workflow.yaml, the MapReduce pattern (kept in sync
// by TestWordcountPatternIsTheExample).
//
//go:embed wordcount.yaml
var wordcountYAML []byte

var wordcount = func() *v1alpha1.Workflow {
	var wf v1alpha1.Workflow
	if err := yaml.UnmarshalStrict(wordcountYAML, &wf); err != nil {
		panic("embedded wordcount workflow: " + err.Error())
	}
	return &wf
}()
