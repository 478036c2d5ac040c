use clap::Parser;
use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
    zimage::platform::end_quietly_on_closed_pipe();
    let kernel_cache = zimage::platform::cache_dir().map(|d| d.join("mlx-kernels"));
    if let Err(err) = zimage::mlx::runtime::start(kernel_cache.as_deref()) {
        eprintln!("error: {err}");
        return cli::exit_error();
    }
    zimage::files::remove_temporaries_on_signal();
    zimage::platform::return_freed_memory_to_the_system();
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            // Every error embeds its own cause or chains it, never both, so the chain prints
            // as it is; control characters from a path or a value stay on the one line.
            eprintln!(
                "error: {}",
                zimage::shown::escape_controls(&format!("{err:#}"))
            );
            cli::exit_error()
        }
    }
}
