package capiocl

import (
	"fmt"
	"strings"
)

// Origins maps the field paths of a Workflow converted from a CAPIO-CL document
// ("spec.steps[1].inputs[0]") to the JSON paths of the document's values they came from
// ("IO_Graph[1].input_stream[0]"); "" is the document itself. ToWorkflowOrigins makes it.
type Origins map[string]string

// list maps the Workflow list fp and its n elements to the document's list at (none if
// n is 0: the document may have no such list).
func (o Origins) list(fp, at string, n int) {
	if n == 0 {
		return
	}
	o[fp] = at
	for i := range n {
		o[fmt.Sprintf("%s[%d]", fp, i)] = fmt.Sprintf("%s[%d]", at, i)
	}
}

// JSONPath returns the JSON path in the document of the value the Workflow field path
// fieldPath came from: that of fieldPath itself, or else of its longest parent that has
// one ("" for the document itself, and for a field the document has no counterpart of).
func (o Origins) JSONPath(fieldPath string) string {
	for p := fieldPath; p != ""; p = parentPath(p) {
		if at, ok := o[p]; ok {
			return at
		}
	}
	return ""
}

// parentPath strips the last element of a field path: "a.b[2]" -> "a.b" -> "a" -> "".
func parentPath(p string) string {
	if i := strings.LastIndexAny(p, ".["); i >= 0 {
		return p[:i]
	}
	return ""
}

// isWorkflowPath reports whether p is a Workflow field path (spec..., metadata...).
func isWorkflowPath(p string) bool {
	for _, top := range []string{"spec", "metadata"} {
		if rest, ok := strings.CutPrefix(p, top); ok && (rest == "" || rest[0] == '.' || rest[0] == '[') {
			return true
		}
	}
	return false
}

// Message says msg, a warning about the document named file or about the Workflow
// converted from it, in the document's terms: a leading Workflow field path
// ("spec.steps[1].inputs[0]: ...") becomes the JSON path it came from, and the file is
// named first: "wf.json: IO_Graph[1].input_stream[0]: ...". A message that begins with a
// JSON path already (the warnings of ToWorkflow) only gets the file.
func (o Origins) Message(file, msg string) string {
	if head, rest, ok := strings.Cut(msg, ": "); ok && isWorkflowPath(head) {
		if at := o.JSONPath(head); at != "" {
			msg = at + ": " + rest
		} else {
			msg = rest
		}
	}
	if file == "" {
		return msg
	}
	return file + ": " + msg
}

// Messages is Message for each of msgs.
func (o Origins) Messages(file string, msgs []string) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = o.Message(file, m)
	}
	return out
}
