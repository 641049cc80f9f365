package tensordict

import "errors"

// Errors returned by this package, wrapped with detail; match them with
// errors.Is. Errors from the memmap package (memmap.ErrIndex, ErrDType,
// ErrShape, ErrShortFile, ErrClosed, ErrFault) pass through wrapped as well.
var (
	// ErrNotFound is returned when a key is not in the TensorDict.
	ErrNotFound = errors.New("tensordict: key not found")

	// ErrBatchSize is returned when a value's shape does not start with the
	// TensorDict's batch size, or batch sizes of TensorDicts combined by
	// SetRows, Stack or Cat do not fit together.
	ErrBatchSize = errors.New("tensordict: batch size mismatch")

	// ErrSchema is returned when two TensorDicts that must have the same keys,
	// dtypes and shapes (SetRows, Stack, Cat) do not, for a RowSchema that
	// Validate refuses, and by RowSchema.Match for one that differs.
	ErrSchema = errors.New("tensordict: bad schema")

	// ErrKey is returned for a key that cannot be stored: one that clashes
	// with a meta.json field when memory-mapping, or a value of the wrong
	// kind at a key (a tensor where a TensorDict is expected).
	ErrKey = errors.New("tensordict: bad key")

	// ErrLocked is returned when adding or removing keys of a memory-mapped
	// TensorDict, whose keys are fixed by the files on disk (as tensordict
	// locks a memory-mapped TensorDict). Its tensors stay writable.
	ErrLocked = errors.New("tensordict: memory-mapped TensorDict is locked")

	// ErrFormat is returned by LoadMemmap for a prefix that is not a valid
	// tensordict memmap folder: corrupt or missing meta.json (or one that
	// names a member twice), an unknown dtype, a missing or short leaf
	// file, a folder reached twice in one load. The message names the file.
	ErrFormat = errors.New("tensordict: bad memmap format")

	// ErrUnsupported is returned by LoadMemmap for content that tensordict can
	// write but this package refuses to read, such as pickled non-tensor
	// data or lazy stacks; the message says what and where.
	ErrUnsupported = errors.New("tensordict: unsupported content")
)
