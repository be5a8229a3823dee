//! `joader bench decode`: the shared pipeline against Pillow (with and without `draft()`) on
//! the same files, one thread each.

use anyhow::Result;
use clap::Args;

#[derive(Debug, Args)]
pub struct DecodeBenchArgs {
    /// Where the generated images go (reused).
    #[arg(long, default_value = "joader-bench-data/decode")]
    pub data: std::path::PathBuf,
    /// Images per size.
    #[arg(long, default_value_t = 120)]
    pub images: u32,
}

/// joader's shared pipeline (zune-jpeg + fast_image_resize) against Pillow on the same files,
/// one core each, at 500x375 and 1000x750.
pub fn decode(args: DecodeBenchArgs) -> Result<()> {
    use crate::synth::{SynthSpec, generate_image_folder};
    use actors::pipeline::{Pipeline, bench_decode};
    let pipeline = Pipeline::Decode {
        resize_shorter: Some(256),
        center_crop: Some([224, 224]),
    };
    let pillow = std::process::Command::new("python3")
        .args(["-c", "import PIL"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !pillow {
        println!("Pillow is not installed (pip install pillow): only joader's figures are printed");
    }
    println!(
        "{:>10} {:>16} {:>16} {:>16} {:>12} {:>12}",
        "size", "joader img/s", "pillow img/s", "pillow+draft", "vs pillow", "vs draft"
    );
    for (w, h) in [(500u32, 375u32), (1000, 750)] {
        let dir = args.data.join(format!("{w}x{h}"));
        let spec = SynthSpec {
            classes: 1,
            per_class: args.images,
            width: w,
            height: h,
            quality: 90,
            seed: 7,
        };
        generate_image_folder(&dir, &spec, &mut |_| {})?;
        let mut paths: Vec<std::path::PathBuf> = std::fs::read_dir(dir.join("class_00"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        paths.sort();
        let (ours, _) = bench_decode(&paths, &pipeline);
        let py = |mode: &str| -> Option<f64> {
            if !pillow {
                return None;
            }
            let out = std::process::Command::new("python3")
                .args(["-c", include_str!("pillow_decode.py"), mode])
                .args(&paths)
                .output()
                .ok()?;
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            v["images_per_s"].as_f64()
        };
        let (plain, draft) = (py("plain"), py("draft"));
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.0}"));
        let ratio = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{:.2}x", ours / x));
        println!(
            "{:>10} {:>16.0} {:>16} {:>16} {:>12} {:>12}",
            format!("{w}x{h}"),
            ours,
            fmt(plain),
            fmt(draft),
            ratio(plain),
            ratio(draft)
        );
    }
    println!(
        "(decode + resize shorter side to 256 + center crop 224, one thread each; target >= 2x Pillow)"
    );
    Ok(())
}
