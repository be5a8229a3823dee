//! The `joader` binary: sets up logging, parses the command line and runs one subcommand:
//! `serve` from the daemon's crate (`server`), every other from this one.
use clap::{Parser, Subcommand};
#[cfg(feature = "bench")]
use joader_tools::bench;
use joader_tools::{append, cleanup, consume, demo, preload, simulate, synth};

/// mimalloc instead of glibc's malloc: the loader threads allocate and free a decoded image
/// (hundreds of KiB) per element, often freed on another thread (the Cache's); glibc returns
/// such memory to the kernel and takes it back again (`munmap`, heap trimming), and every page
/// of the next image then faults and is zeroed. mimalloc keeps freed pages for reuse, which
/// took the server's decode and resize stages from about 1.15x the bare pipeline to its level
/// in `bench e2e --only "gpu lock"` (the bench runs the bare pipeline in this same binary,
/// with the same allocator).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "joader",
    version,
    about = "Prepare training data once, serve it to many jobs through shared memory"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server: REST API, sampler, loader and shared-memory cache.
    Serve(Box<server::serve::ServeArgs>),
    /// Generate an ImageNet-like dataset and run four jobs against an in-process server.
    Demo(demo::DemoArgs),
    /// Register a job with a running server and read it to the end (a debugging client; the
    /// integration tests run it as a separate process). Prints a JSON summary.
    Consume(consume::ConsumeArgs),
    /// Preload a dataset's working set into a running server's cache and pin it there, so
    /// that jobs started later decode nothing of it; waits with a progress bar.
    Preload(preload::PreloadArgs),
    /// Append shards, Parquet files, manifest files or class folders to a running server's
    /// dataset while its jobs run (they cover the new items from their next epoch).
    Append(append::AppendArgs),
    /// Generate a synthetic ImageNet-like ImageFolder dataset (JPEGs in class folders).
    GenDataset(synth::GenDatasetArgs),
    /// Simulate samplers and cache policies on synthetic datasets and count cache misses.
    Simulate(simulate::SimulateArgs),
    /// Remove the shared memory a dead server of an instance left in /dev/shm (a server killed
    /// by SIGKILL or the OOM killer), without restarting it. Refused while a server runs it.
    Cleanup(cleanup::CleanupArgs),
    /// Benchmarks that print measured figures and ratios (a build of the source tree; the
    /// shipped binary is built without them).
    #[cfg(feature = "bench")]
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

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
        // A log line that cannot be written (stderr a pipe whose reader is gone: the parent
        // that started the server died, `joader serve | head`) is dropped. With the default,
        // the subscriber reports the failure with `eprintln!`, which panics on that same
        // stderr, in whatever thread logged: the SIGTERM handler's task among them, and the
        // server then never stopped.
        .log_internal_errors(false)
        .init();
    match Cli::parse().command {
        Command::Serve(args) => server::serve::serve(*args),
        Command::Demo(args) => demo::run(args),
        Command::Consume(args) => consume::run(args),
        Command::Preload(args) => preload::run(args),
        Command::Append(args) => append::run(args),
        Command::Cleanup(args) => cleanup::run(args),
        Command::GenDataset(args) => synth::gen_dataset(args),
        Command::Simulate(args) => simulate::run(args),
        #[cfg(feature = "bench")]
        Command::Bench(command) => bench::run(command),
    }
}
