//! The one runner: a [`Job`] in, images with their metadata out. The job is checked, the
//! model loaded by its family, the options its family does not take refused by name before
//! any weights load, and the family's runner makes the images; front ends only parse requests
//! into jobs and encode what comes back.

use super::Engine;
use crate::jobs::batch::{Outcome, Reporter};
use crate::jobs::error::Error;
use crate::jobs::job::Job;
use crate::jobs::progress::{Cancel, Progress};

/// Makes the job's images on `engine`, reporting to `progress`, stopping at the next step
/// boundary once `cancel` is set.
pub fn run(
    job: &Job,
    engine: &mut Engine,
    progress: &mut dyn FnMut(&Progress),
    cancel: &Cancel,
) -> Result<Outcome, Error> {
    job.check()?;
    let mut reporter = Reporter::new(progress, job.count as usize);
    reporter.phase("load");
    engine.load(&job.model)?;
    let (family, model) = engine.loaded();
    (family.refuse_for(model.source(), &job.features())).map_err(Error::Request)?;
    model.run(job, &mut reporter, cancel)
}
