//! The `baton` binary: argument parsing and error reporting at the edge; everything else
//! lives in the library.

mod cli;

fn main() {
    let cli = cli::parse();
    // Before the log, which lives in the cache dir, and before any kernel runs.
    if let Err(e) = cli::check_environment() {
        eprintln!("error: {}", cli::error_line(&e));
        std::process::exit(1);
    }
    // candle's quantized kernels take their own switch down to AVX2, which only the
    // environment they start in can give: the process starts again with it.
    if let Err(e) = cli::library_switches::start_with_them() {
        eprintln!("error: {}", cli::error_line(&e));
        std::process::exit(1);
    }
    // A log file that cannot be written (a shared cache's logs/ owned by someone else)
    // is said once and never stops the command.
    let log = baton::logging::init_logging_or_warn(&baton::logging::default_log_dir());
    if let Some(warning) = &log.warning {
        eprintln!("warning: {warning}");
    }
    if let Err(e) = cli::run(cli) {
        let line = cli::error_line(&e);
        tracing::error!("{line}");
        eprintln!("error: {line}");
        std::process::exit(1);
    }
}
