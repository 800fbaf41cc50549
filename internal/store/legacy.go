package store

import "context"

// The accounting-only methods below are kept while the writers move onto Files.

// Reserve is reserveUpTo.
func (s *Store) Reserve(ctx context.Context, rel string, end int64) error {
	return s.reserveUpTo(ctx, rel, end)
}

// Resize is resize.
func (s *Store) Resize(rel string, size int64) { s.resize(rel, size) }

// Recount is recount.
func (s *Store) Recount(rel string, fd int) error { return s.recount(rel, fd) }

// Forget is forget.
func (s *Store) Forget(rel string) { s.forget(rel) }

// Rename is moveAccounting.
func (s *Store) Rename(oldRel, newRel string) { s.moveAccounting(oldRel, newRel) }

// RenameAt is renameAt.
func (s *Store) RenameAt(oldRel, newRel string, flags uint) error {
	return s.renameAt(oldRel, newRel, flags)
}

// Unlink is unlink.
func (s *Store) Unlink(rel string) error { return s.unlink(rel) }

// Truncate is truncate.
func (s *Store) Truncate(rel string, size int64) error { return s.truncate(rel, size) }
