//! `keyroute`: thin glue over the libraries. Parse, validate, dispatch; errors map to exit codes
//! (64 for usage and configuration errors, 2 for runtime errors).

mod cli;
mod demo;
mod members;
mod place;
mod process;
mod relocate;
mod serve;
mod sim;

use std::fmt;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command, SimCommand};

/// A usage or configuration error: the user can fix it by changing the command or the config.
#[derive(Debug)]
pub struct Usage(pub String);

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// A proxy allocates and frees a few small buffers per request; mimalloc's thread-local free
/// lists make that a fraction of glibc's cost (measured in BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Gives back to the system the pages this thread freed more than mimalloc's purge delay ago
/// (1 s). mimalloc purges only when it is called again, so a thread whose clients all went idle
/// would hold them for good; the gateway calls this on each of its threads every few seconds
/// ([`keyroute_server::Gateway::trim_memory`]).
fn give_back_memory() {
    // SAFETY: `mi_collect` takes no pointer and may be called from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(false) }
}

const EXIT_USAGE: u8 = 64;
const EXIT_RUNTIME: u8 = 2;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Command::Place(args) => place::run(&args),
        Command::SlotPlan(args) => place::slot_plan(&args),
        Command::Slot(args) => place::slot(&args),
        Command::Sim(SimCommand::Remap(args)) => sim::remap(&args),
        Command::Sim(SimCommand::Balance(args)) => sim::balance(&args),
        Command::Sim(SimCommand::Choices(args)) => sim::choices(&args),
        Command::Sim(SimCommand::Fleet(args)) => sim::fleet(&args),
        Command::Sim(SimCommand::Whatif(args)) => sim::whatif(&args),
        Command::Sim(SimCommand::Trace(args)) => sim::trace(&args),
        Command::Serve(args) => serve::serve(&args),
        Command::Worker(args) => serve::worker(&args),
        Command::Members(args) => members::members(&args),
        Command::Register(args) => members::register(&args),
        Command::Demo(args) => demo::run(&args),
        Command::FromNutcracker(args) => serve::from_nutcracker(&args),
        Command::Move(args) => relocate::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) {
                return ExitCode::SUCCESS; // `keyroute place ... | head` is not an error
            }
            eprintln!("keyroute: {e:#}");
            ExitCode::from(if e.downcast_ref::<Usage>().is_some() { EXIT_USAGE } else { EXIT_RUNTIME })
        }
    }
}
