package capiocl_test

import (
	"fmt"

	"github.com/sluice-io/sluice/internal/capiocl"
)

// A CAPIO-CL document becomes a Workflow: its IO_Graph steps become steps, each
// streaming rule the outputs it names.
func ExampleToWorkflow() {
	doc, err := capiocl.Parse("pipeline.json", []byte(`{
  "name": "pipeline",
  "IO_Graph": [
    {"name": "writer", "input_stream": [], "output_stream": ["data.bin"],
     "streaming": [{"name": ["data.bin"], "committed": "on_close", "mode": "no_update"}]},
    {"name": "reader", "input_stream": ["data.bin"], "output_stream": []}
  ]
}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	wf, warnings := capiocl.ToWorkflow(doc)
	for _, s := range wf.Spec.Steps {
		for _, o := range s.Outputs {
			fmt.Println(s.Name, "writes", o.Path, o.Commit.Rule, o.Fire)
		}
		for _, in := range s.Inputs {
			fmt.Println(s.Name, "reads", in)
		}
	}
	fmt.Println(len(warnings), "warnings")
	// Output:
	// writer writes data.bin OnClose NoUpdate
	// reader reads data.bin
	// 0 warnings
}
