//! Benchmark commands: each prints the figures it measured on this machine.
use clap::Subcommand;

use crate::config::Config;

#[derive(Subcommand, Debug)]
pub enum Bench {
    /// Held-out accuracy of the local classifier.
    Classifier,
}

pub async fn run(config: Config, which: Bench) -> anyhow::Result<()> {
    let embedder = app::core::embed::EmbedderHandle::new(&config.model_dir);
    match which {
        Bench::Classifier => {
            let (correct, total, confusion) = app::core::classify::held_out_accuracy(&embedder).await?;
            println!("classifier held-out accuracy: {correct}/{total} = {:.1} %", 100.0 * correct as f64 / total as f64);
            println!("confusion (rows: true sector, columns: predicted) {:?}", app::core::classify::SECTORS);
            for (i, row) in confusion.iter().enumerate() {
                println!("  {:<11} {:?}", app::core::classify::SECTORS[i], row);
            }
            Ok(())
        }
    }
}
