package bench

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/validation"
)

func TestWordcountPatternIsTheExample(t *testing.T) {
	example, err := os.ReadFile("../../examples/wordcount/workflow.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(example, wordcountYAML) {
		t.Fatal("internal/bench/wordcount.yaml differs from examples/wordcount/workflow.yaml: copy it over")
	}
}

// Every pattern of both profiles is a valid Workflow under both firing rules.
func TestPatternsAreValid(t *testing.T) {
	for _, prof := range []Profile{Quick, Full} {
		for _, p := range Patterns(prof) {
			for _, fire := range []v1alpha1.FireRule{v1alpha1.FireUpdate, v1alpha1.FireNoUpdate} {
				if _, err := validation.ValidateWorkflow(context.Background(), p.Name, p.Build(fire)); err != nil {
					t.Errorf("%s/%s/%s: %v", prof.Name, p.Name, fire, err)
				}
			}
		}
	}
}
