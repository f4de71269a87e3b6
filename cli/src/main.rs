//! The `kinesis-dataflow` command-line tool: `status`, `workers` and `reset` for an
//! application's lease table and a stream, and `kcl import` / `kcl export` between it and a
//! KCL application's lease table, and `lease-table copy` into a table keyed by stream and shard.
//! `kinesis-dataflow --help` for the commands.
//!
//! Configured only by the standard AWS environment (region, credentials, endpoint overrides
//! such as `AWS_ENDPOINT_URL_KINESIS` / `AWS_ENDPOINT_URL_DYNAMODB`). Exit status: 0 done, 1 a
//! call failed, 2 bad input (nothing written), 3 refused because live instances (or KCL
//! workers) hold the leases (nothing written).
#![forbid(unsafe_code)]

mod args;
mod aws;
mod copy;
mod kcl;
mod kcl_args;
mod output;
mod reset;
mod status;
mod time;
mod workers;

use std::process::ExitCode;

/// Why the tool stops without doing what it was asked: the message, and the exit status.
#[derive(Debug)]
pub struct Failure {
    /// What went wrong, naming the bad value.
    pub message: String,
    /// The exit status.
    pub code: u8,
}

impl Failure {
    /// Bad input (a flag, a name, a position): exit status 2.
    pub fn usage(message: String) -> Self {
        Self { message, code: 2 }
    }

    /// A call failed: exit status 1.
    pub fn failed(message: String) -> Self {
        Self { message, code: 1 }
    }

    /// Refused because live instances hold the leases: exit status 3.
    pub fn refused(message: String) -> Self {
        Self { message, code: 3 }
    }
}

/// Runs one command.
async fn run(command: args::Command) -> Result<(), Failure> {
    match command {
        args::Command::Status(a) => status::run(&a).await,
        args::Command::Workers(a) => workers::run(&a).await,
        args::Command::Reset(a) => reset::run(&a).await,
        args::Command::Kcl(a) => kcl::run(&a).await,
        args::Command::Copy(a) => copy::run(&a).await,
    }
}

/// Parses the command line, then runs the command on a single-threaded runtime; the exit
/// status says how it went.
fn main() -> ExitCode {
    let command = match args::parse(std::env::args_os(), time::now_ms()) {
        Ok(command) => command,
        // Help and version (exit status 0) and clap's usage errors (2), printed as clap does.
        Err(args::ParseError::Clap(error)) => {
            // Nothing more can be said when standard output or error is gone.
            let _ = error.print();
            return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
        }
        Err(args::ParseError::Invalid(failure)) => {
            eprintln!("kinesis-dataflow: {}", failure.message);
            eprintln!("see `kinesis-dataflow --help`");
            return ExitCode::from(failure.code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("kinesis-dataflow: could not start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("kinesis-dataflow: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}
