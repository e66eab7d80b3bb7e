//! `--mmap`: whether a command keeps the model file mapped or reads it into huge-page
//! memory first, and the one place commands open models.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use nx_llama_stack::Placement;
use nx_run::Model;

/// Where the weights live while a command runs.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct WeightsArgs {
    /// Keep the model file memory-mapped (pages read as they are used, shared with the
    /// page cache) instead of reading it into huge-page memory when the model opens. The
    /// resident copy is the default wherever transparent huge pages are on and the file
    /// fits twice in available memory: decode streams every weight each token, and on 2
    /// MiB pages that stream misses the TLB far less. Outputs are the same bits either way.
    #[arg(long)]
    pub mmap: bool,
}

impl WeightsArgs {
    /// The placement for `path`: mapped with `--mmap`, else [`Placement::choose`]'s; and
    /// the file's length when it could be read.
    pub fn placement(&self, path: &Path) -> (Placement, Option<u64>) {
        let len = std::fs::metadata(path).ok().map(|meta| meta.len());
        let placement = match len {
            Some(len) if !self.mmap => Placement::choose(len).0,
            // --mmap, or a file opening will name the problem.
            _ => Placement::Mapped,
        };
        (placement, len)
    }
}

/// Files from this size on take long enough to copy (seconds on a VM whose host must
/// fault the memory in again) that a line on stderr says what is happening.
const ANNOUNCE_BYTES: u64 = 1 << 30;

/// Says on stderr that a large file (`len` bytes) is being read into memory, and how to
/// avoid it.
fn announce_long_read(len: u64) {
    if len >= ANNOUNCE_BYTES {
        eprintln!(
            "nx: reading {:.2} GB of weights into huge-page memory (--mmap maps the file instead)",
            len as f64 / 1e9
        );
    }
}

/// Opens a model file, naming it in the error, and installs its kernel plan.
pub fn open_model(path: &Path, weights: &WeightsArgs) -> Result<Arc<Model>> {
    Ok(open_model_with_plan(path, weights)?.0)
}

/// [`open_model`], with how its kernel plan was made (timed, silently, the first time a
/// model's shapes are seen on this machine, then cached; `nx bench --show-plan` shows it).
pub fn open_model_with_plan(
    path: &Path,
    weights: &WeightsArgs,
) -> Result<(Arc<Model>, crate::kernel_plan::PlanReport)> {
    let (placement, len) = weights.placement(path);
    if let (Placement::Resident, Some(len)) = (placement, len) {
        announce_long_read(len);
    }
    let model = match Model::open_placed(path, placement) {
        Ok(model) => model,
        // The copy can fail where the mapping works (no memory for it after all): map.
        // A file nx cannot run fails mapped too, and that error names the problem.
        Err(copy_error) if placement == Placement::Resident => {
            let model = Model::open(path).with_context(|| format!("{}", path.display()))?;
            eprintln!("nx: could not read the weights into memory ({copy_error}); mapped instead");
            model
        }
        Err(e) => return Err(e).with_context(|| format!("{}", path.display())),
    };
    let report = crate::kernel_plan::prepare(&model).context("kernel plan")?;
    Ok((Arc::new(model), report))
}
