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
            // Errors name their file in their own message and also chain their cause; print
            // each cause once.
            let mut msg = err.to_string();
            for cause in err.chain().skip(1) {
                let cause = cause.to_string();
                if !msg.contains(&cause) {
                    msg = format!("{msg}: {cause}");
                }
            }
            eprintln!("error: {msg}");
            cli::exit_error()
        }
    }
}
