//! The `joader` binary: sets up logging and runs the command line.
fn main() -> anyhow::Result<()> {
    // The demo draws progress bars: only warnings from its in-process server.
    let quiet = std::env::args().nth(1).is_some_and(|a| a == "demo");
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("JOADER_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(if quiet { "warn" } else { "info" })
            }),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    server::cli::main()
}
