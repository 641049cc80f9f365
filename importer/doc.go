// Package importer builds on-disk TensorDict datasets, in PyTorch
// tensordict's memory-mapped format, from files in other formats: IDX
// image/label pairs (MNIST, Fashion-MNIST; gzipped or not) with IDX, and
// NumPy .npy files with NPY. "tensorwire import" is a command line over it.
//
// What an import guarantees:
//
//   - Streaming. The data goes from the decoder into the mapped storage in
//     chunks of 1 MiB; memory use does not grow with the dataset's size.
//   - Checked input. Every input file is read to its end, so bytes after the
//     data and a corrupt gzip checksum are errors (ErrFormat), as are
//     inputs that do not fit together (ErrInvalid).
//   - All or nothing. The dataset is built in a temporary folder next to the
//     prefix (".NAME.importing-*"), flushed, and renamed to the prefix when
//     complete; the parent folder is synced, so the rename survives a crash
//     once the import returns. A failed or cancelled import removes its
//     temporary folder and leaves no prefix that loads.
//   - Nothing is replaced that is not a dataset. An existing prefix is
//     ErrExists unless Options.Force is set, and Force replaces only a
//     tensordict dataset (a folder with a meta.json and nothing beside it
//     but what the format writes: <key>.memmap files and nested folders
//     that are datasets themselves, including NonTensorData folders) or an
//     empty folder. Anything else (a file, a symbolic link, a folder with
//     other content, the current directory or one of its parents, the
//     filesystem root) is ErrNotReplaceable, Force or not, and is left
//     alone.
//   - The old dataset stays until the new one is in place. With Force, the
//     new dataset is built first; then the old one is renamed aside (to
//     ".NAME.importing-*.old"), checked again there, the new one renamed to
//     the prefix, and only then is the old one removed. If the new one
//     cannot be renamed into place, the old one is renamed back. A crash
//     between those two renames leaves the old dataset in the ".old"
//     folder, not lost.
//
// The functions are safe for concurrent use on different prefixes. Of two
// imports racing to create the same prefix without Force, one fails. A
// process that has the old dataset mapped keeps reading the old files
// after it is replaced.
package importer
