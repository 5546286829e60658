//! Which partitions the controller's config keeps. A partition dropped from the spec while
//! live or recent jobs, or a worker set, still reference it stays in the config, set to DRAIN
//! (no new jobs; running ones finish), and the cluster's conditions say why. slurm-operator's
//! #138: removing such a partition crash-looped slurmctld.

use std::collections::BTreeSet;

use crate::crd::cluster::{PartitionSpec, PartitionStateSpec};

#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub partitions: Vec<PartitionSpec>,
    /// Removed from the spec, kept because referenced (sorted).
    pub retained: Vec<String>,
}

/// `previously`: partitions the last rendered config had (spec and retained ones);
/// `referenced`: partitions named by jobs still in the controller (pending, running, or
/// ended recently) or by worker sets of the cluster.
pub fn render(
    spec: &[PartitionSpec],
    previously: &[String],
    referenced: &BTreeSet<String>,
) -> Rendered {
    let mut partitions: Vec<PartitionSpec> = spec.to_vec();
    let mut retained = Vec::new();
    for name in previously {
        if spec.iter().any(|p| &p.name == name) || !referenced.contains(name) {
            continue;
        }
        partitions.push(PartitionSpec {
            name: name.clone(),
            default: false,
            state: Some(PartitionStateSpec::Drain),
            ..Default::default()
        });
        retained.push(name.clone());
    }
    retained.sort();
    retained.dedup();
    Rendered {
        partitions,
        retained,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str) -> PartitionSpec {
        PartitionSpec {
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_removed_partition_still_referenced_stays_drained() {
        let referenced: BTreeSet<String> = ["old".to_owned()].into();
        let r = render(
            &[p("gpu")],
            &["gpu".into(), "old".into(), "gone".into()],
            &referenced,
        );
        let names: Vec<&str> = r.partitions.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, vec!["gpu", "old"], "unreferenced 'gone' is dropped");
        assert_eq!(r.partitions[1].state, Some(PartitionStateSpec::Drain));
        assert_eq!(r.retained, vec!["old"]);
    }

    #[test]
    fn once_no_job_references_it_the_partition_goes() {
        let r = render(&[p("gpu")], &["gpu".into(), "old".into()], &BTreeSet::new());
        assert_eq!(r.partitions.len(), 1);
        assert!(r.retained.is_empty());
    }
}
