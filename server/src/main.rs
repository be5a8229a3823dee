//! The `joader` binary: parses the command line and dispatches to `server`'s subcommands.
fn main() -> anyhow::Result<()> {
    server::cli::main()
}
