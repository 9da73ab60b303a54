//! npz and JSON input/output (in progress)
