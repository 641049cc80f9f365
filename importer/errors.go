package importer

import "errors"

// Errors an import returns, wrapped with the path and the reason; match them
// with errors.Is.
var (
	// ErrExists: something is at the prefix that Options.Force would
	// replace (a dataset, or an empty folder), and Force is not set.
	ErrExists = errors.New("importer: prefix exists")

	// ErrNotReplaceable: something is at the prefix that an import never
	// replaces, with Force or without: a file, a symbolic link, a folder
	// holding anything the tensordict format does not write, the current
	// directory or one of its parents, or the filesystem root. The error
	// names the path and the reason; nothing was changed.
	ErrNotReplaceable = errors.New("importer: will not replace")

	// ErrInvalid: the arguments do not describe one dataset: no input
	// files, a key given twice (or as both a tensor and a folder of
	// tensors), or inputs whose row counts or row shapes differ.
	ErrInvalid = errors.New("importer: invalid input")

	// ErrFormat: an input file is malformed: a bad header, data shorter or
	// longer than the header says, a corrupt gzip stream. The error names
	// the file.
	ErrFormat = errors.New("importer: malformed input file")

	// ErrUnsupported: an input file is well formed but holds what the
	// importer does not import: a .npy of a structured, string or object
	// dtype or a Fortran-order layout it cannot stream, IDX images that are
	// not uint8 [N, H, W], IDX labels that are not integers [N].
	ErrUnsupported = errors.New("importer: unsupported input")
)
