//! One module per command.

pub mod bench;
pub mod conformance;
pub mod devices;
pub mod kernels;
pub mod main_job;

/// Errors of the command line front end: a unirt error or an I/O failure writing a report.
pub type CliResult<T> = Result<T, Box<dyn std::error::Error>>;
