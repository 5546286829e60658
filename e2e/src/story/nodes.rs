//! Step 1: the nodes the story declares on the harness, `sys-0` for the controller and
//! login pods and the GPU pool `gpu-0..` (each run by the process kubelet).

use super::print::say;
use super::{POOL, Story, StoryError, kit_err, manifests};
use crate::kubelet::NodeSpec;

impl Story<'_> {
    pub(super) async fn nodes(&self) -> Result<(), StoryError> {
        say(&format!(
            "nodes: sys-0 (controller, login) and a pool gpu-0..gpu-{} of {} CPUs, {} GiB, {} GPUs each",
            POOL.nodes - 1,
            POOL.cpus,
            POOL.mem_gib,
            POOL.gpus
        ));
        let (sk, sv) = manifests::SYSTEM_LABEL;
        self.cluster
            .declare(NodeSpec::new("sys-0", "4", "8Gi", 0).label(sk, sv))
            .await
            .map_err(kit_err("declaring sys-0"))?;
        let (pk, pv) = manifests::POOL_LABEL;
        for i in 0..POOL.nodes {
            let name = format!("gpu-{i}");
            self.cluster
                .declare(
                    NodeSpec::new(
                        &name,
                        &POOL.cpus.to_string(),
                        &format!("{}Gi", POOL.mem_gib),
                        POOL.gpus,
                    )
                    .label(pk, pv),
                )
                .await
                .map_err(kit_err("declaring a pool node"))?;
        }
        Ok(())
    }
}
