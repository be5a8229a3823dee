//! `joader cleanup`: removes what a dead server of an instance left in /dev/shm.

use anyhow::{Context, Result};
use clap::Args;

#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// The dead server's shared-memory instance name.
    #[arg(long, env = "JOADER_INSTANCE", default_value = "default")]
    pub instance: String,
}

pub fn run(args: CleanupArgs) -> Result<()> {
    let removed = dataplane::remove_dead_instance(&args.instance).with_context(|| {
        format!(
            "cannot clean up instance {:?} (a running server removes its own on stop)",
            args.instance
        )
    })?;
    // The lock is always in the list (taking it creates it when the dead server's is gone).
    if removed.len() <= 1 {
        println!("instance {:?} had nothing left in /dev/shm", args.instance);
    } else {
        for name in &removed {
            println!("removed /dev/shm/{name}");
        }
    }
    Ok(())
}
