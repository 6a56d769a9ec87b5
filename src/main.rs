//! The `baton` binary: argument parsing and error reporting at the edge; everything else
//! lives in the library.

mod cli;

fn main() {
    // Libraries (candle) capture a backtrace into their errors when RUST_BACKTRACE is
    // set, and print it as part of the message; a user's error stays one clear line.
    // Panics still honour RUST_BACKTRACE. Set before any thread starts.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    let cli = cli::parse();
    // Before the log, which lives in the cache dir, and before any kernel runs.
    if let Err(e) = cli::check_environment() {
        eprintln!("error: {}", cli::error_line(&e));
        std::process::exit(1);
    }
    // The library reads the activations' dtype and the attention path where it loads a
    // model; the flag wins over the environment it came from. Set before any thread
    // starts.
    std::env::set_var(baton::model::ACTIVATIONS_ENV, &cli.activations);
    std::env::set_var(baton::model::ATTENTION_ENV, &cli.attention);
    // candle's quantized kernels take their own switch down to AVX2.
    if baton::kernels::avx2_only() {
        std::env::set_var("MISTRALRS_FORCE_AVX2", "1");
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
