// Package semantics implements the CAPIO-CL semantics of a Workflow without any I/O: it
// resolves a path to its commit and firing rule (RuleSet) and runs the per-file state
// machine that answers whether a reader may open a file, how many bytes it may read and
// whether it has reached the end (Engine).
//
// The rules are those of the CAPIO-CL language as summarised in docs/semantics.md:
// commit rules on_termination[:N], on_close[:N], on_file, on_n_files; firing rules update
// and no_update; aliases, globs, exclude and a dir/file rule overriding its dir rule.
//
// # Files
//
// The rules: ruleset.go (RuleSet, Resolution), compile.go (Compile), cycles.go, home.go.
// The Engine: engine.go (the type, its records and snapshots), events.go (what views and
// peers report: Create, Write, Close, Rename, Terminate...), commit.go (when a commit rule
// holds), lifetime.go (Consumed files: release and punch), failure.go (Fail, Poison,
// Withdraw), waits.go (WaitExists, WaitOpen, WaitRead, WaitDir), observers.go (Observer:
// what is told of each update), errors.go (the errors waits and events end with).
//
// # Failure modes
//
// A file can go wrong in three ways, each with its own method; they differ in who calls
// it, how far it reaches and whether the file can recover.
//
//   - Fail(p, err): this node cannot hold p's bytes: storing bytes written on another
//     node (materialised or fetched) found its store full. Called by this node's
//     transport peers only; other nodes are not told and their readers are unaffected.
//     Readers here get a *WaitError wrapping err (transport.ErrUnavailable; EIO) from
//     every wait on p, current and future, while the file may commit elsewhere. A retry
//     does not make it readable here: the host's record of the failure stays, and the
//     peers refuse later bytes of p from other nodes too.
//   - Poison(p, reason): p can never be complete, because a write to it failed (ENOSPC
//     after the space wait, EIO) or its writer failed while it was open. Called on the
//     writer's node (its view, or its transport peer), and applied on every other node
//     from the poison event that peer publishes. p never commits, its closes stop
//     counting, and every wait on it ends with a *WaitError wrapping a *PoisonError
//     (ErrPoisoned; EIO). A committed file cannot be
//     poisoned. A writer, a retry included, can rewrite it: truncating it to 0 bytes
//     (open with O_TRUNC) clears the poison.
//   - Withdraw(p, reason): the attempt that produced p failed, so p is taken back,
//     committed or not. Called by the failed attempt's view (streamfs.View.Withdraw, from
//     the sidecar or sluice run) for the files it made, and applied on every node from the
//     withdraw event. The engine forgets p as if it had never been created: readers that
//     had not opened it wait for a retry (or get ErrNeverCreated, ENOENT, once every
//     producer has exited), and readers still reading it through the engine (WaitRead
//     with its Generation) get a *WithdrawnError (ErrWithdrawn; EIO). A retry of the
//     instance writes p again, as a new file with a new Generation.
//
// A fourth ending is not about one file: TerminateFailed records that a producer
// instance failed with no retries left, and the waits on its rules' paths whose commit
// rule can no longer hold end with a *ProducerFailedError naming it. docs/glossary.md,
// "Failure modes", tells the same from the side of the views and the transport.
package semantics
