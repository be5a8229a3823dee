//! `cargo run --release -p dataplane --example bench`: the data-plane
//! benchmark (the same as `joader bench dataplane`).

fn main() {
    match dataplane::bench::run(&dataplane::bench::BenchOptions::default()) {
        Ok(r) => println!("{r}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
