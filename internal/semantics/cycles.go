package semantics

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// waitEdge is "step Consumer cannot open Pattern before every instance of Producer has
// exited": Pattern commits on the termination of all its producer instances and is read
// only after its commit (OnTermination with its full count, Update).
type waitEdge struct {
	Consumer, Producer string
	Rule               *Rule
}

// checkStepCycles refuses a workflow whose steps wait on each other for ever: a cycle of
// steps each of which declares as an input a file that the next one produces under a rule
// that commits only once every producer instance has exited and is readable only after
// its commit (OnTermination with its full count, Update). Each step's open of its input
// waits for the next step's exit, which waits on the one after: nothing ever commits.
// Cycles through OnClose, OnFile, OnNFiles, a partial count or NoUpdate may make
// progress (a step can close or stream an output before it reads its input) and are
// left to the run's deadlock detection. Each cycle is reported once, at the inputs of
// the first step in declaration order, naming every step and file on it.
func (c *compiler) checkStepCycles(fp *field.Path) {
	order := map[string]int{}
	for i, s := range c.spec.Steps {
		order[s.Name] = i
	}
	waits := map[string][]waitEdge{}
	for _, r := range c.rs.rules {
		if r.Commit != v1alpha1.CommitOnTermination || r.Fire != v1alpha1.FireUpdate || r.Count < r.Instances {
			continue
		}
		for _, consumer := range c.rs.consumers[r] {
			if r.producedBy(consumer) {
				continue // a producer reads its own outputs without waiting
			}
			for _, producer := range r.Producers {
				waits[consumer] = append(waits[consumer], waitEdge{consumer, producer, r})
			}
		}
	}
	for consumer, es := range waits {
		sort.Slice(es, func(i, j int) bool {
			if es[i].Producer != es[j].Producer {
				return order[es[i].Producer] < order[es[j].Producer]
			}
			return es[i].Rule.Pattern.String() < es[j].Rule.Pattern.String()
		})
		// one edge per producer (its first file by name) names a cycle well enough
		var kept []waitEdge
		for i, e := range es {
			if i == 0 || e.Producer != es[i-1].Producer {
				kept = append(kept, e)
			}
		}
		waits[consumer] = kept
	}
	// Find each elementary cycle once, starting from its first step in declaration
	// order and visiting only later steps of the same strongly connected component (a
	// step outside it is on no cycle through the start; Johnson's idea without the
	// blocking sets: a workflow has few steps). Every step of the search is charged to
	// the compile's budget, and the search stops after maxCycleErrors cycles.
	scc := components(c.spec.Steps, waits)
	found := 0
	for _, start := range c.spec.Steps {
		if c.stopped || found >= maxCycleErrors {
			return
		}
		ip := fp.Index(order[start.Name]).Child("inputs")
		var path []waitEdge
		onPath := map[string]bool{start.Name: true}
		var walk func(step string)
		walk = func(step string) {
			for _, e := range waits[step] {
				if found >= maxCycleErrors || !c.charge(ip, 1) {
					return
				}
				switch {
				case e.Producer == start.Name:
					found++
					cycle := append(append([]waitEdge(nil), path...), e)
					c.errs = append(c.errs, field.Invalid(ip, c.spec.Steps[order[start.Name]].Inputs,
						"steps wait on each other for ever: "+describeCycle(cycle)+
							"; each input commits only when its producers have exited (OnTermination, Update): declare one of them OnClose or NoUpdate, or break the cycle"))
				case order[e.Producer] > order[start.Name] && !onPath[e.Producer] && scc[e.Producer] == scc[start.Name]:
					onPath[e.Producer] = true
					path = append(path, e)
					walk(e.Producer)
					path = path[:len(path)-1]
					delete(onPath, e.Producer)
				}
			}
		}
		walk(start.Name)
	}
}

// maxCycleErrors is how many step cycles a refusal lists before it stops looking.
const maxCycleErrors = 20

// components numbers the strongly connected components of the wait graph (Tarjan's
// algorithm): two steps have the same number when each waits, through others, on the
// other.
func components(steps []v1alpha1.Step, waits map[string][]waitEdge) map[string]int {
	index := map[string]int{}
	low := map[string]int{}
	onStack := map[string]bool{}
	comp := map[string]int{}
	var stack []string
	next, ncomp := 0, 0
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		for _, e := range waits[v] {
			w := e.Producer
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[w] = false
				comp[w] = ncomp
				if w == v {
					break
				}
			}
			ncomp++
		}
	}
	for _, s := range steps {
		if _, seen := index[s.Name]; !seen {
			visit(s.Name)
		}
	}
	return comp
}

// describeCycle names a cycle as "step a reads "b.txt" of step b, which reads "a.txt" of
// step a".
func describeCycle(cycle []waitEdge) string {
	var b strings.Builder
	for i, e := range cycle {
		if i == 0 {
			fmt.Fprintf(&b, "step %s reads %q of step %s", e.Consumer, e.Rule.Pattern.String(), e.Producer)
		} else {
			fmt.Fprintf(&b, ", which reads %q of step %s", e.Rule.Pattern.String(), e.Producer)
		}
	}
	return b.String()
}
