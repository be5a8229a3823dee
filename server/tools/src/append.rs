//! `joader append`: appends paths to a running server's dataset (`POST
//! /v1/datasets/{name}/append`) and prints what the server answered: the items added, the
//! jobs that cover them and from which epoch.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;

use crate::client::Client;

#[derive(Debug, clap::Args)]
pub struct AppendArgs {
    /// The dataset's name.
    pub dataset: String,
    /// What joins it, read as its source reads its own paths (shards or folders of them,
    /// Parquet files or folders, manifest files, folders of class folders), as the server
    /// sees them.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Server URL.
    #[arg(long, env = "JOADER_SERVER", default_value = "http://127.0.0.1:7480")]
    pub server: String,
    /// Give up waiting for the answer after this many seconds (the server indexes the paths
    /// before it answers).
    #[arg(long, default_value_t = 3600)]
    pub deadline_s: u64,
    #[arg(long, env = "JOADER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

pub fn run(args: AppendArgs) -> Result<()> {
    let client = Client::new(args.server.clone())
        .with_token(args.token.clone())
        .with_timeout(Duration::from_secs(args.deadline_s));
    let path = format!("/v1/datasets/{}/append", args.dataset);
    let answer = client.ok("POST", &path, Some(&json!({ "paths": args.paths })))?;
    let added = answer["added"]
        .as_u64()
        .context("the answer has no `added`")?;
    let items = answer["dataset"]["items"].as_u64().unwrap_or(0);
    eprintln!(
        "appended {added} items to dataset '{}' ({items} now)",
        args.dataset
    );
    for j in answer["jobs"].as_array().into_iter().flatten() {
        eprintln!(
            "  job '{}' covers them from epoch {}",
            j["name"].as_str().unwrap_or("?"),
            j["from_epoch"]
        );
    }
    println!("{}", serde_json::to_string(&answer)?);
    Ok(())
}
