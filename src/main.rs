use clap::Parser;
use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
    zimage::platform::end_quietly_on_closed_pipe();
    zimage::files::remove_temporaries_on_signal();
    zimage::platform::settle_blas_threads();
    zimage::platform::return_freed_memory_to_the_system();
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            // Every error embeds its own cause or chains it, never both, so the chain prints
            // as it is.
            eprintln!("error: {err:#}");
            cli::exit_error()
        }
    }
}
