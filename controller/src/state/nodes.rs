//! The state actor's node requests: sinfo / scontrol show node's listing and drain, resume
//! and down.

use super::*;

impl Actor {
    pub(super) fn update_node(
        &mut self,
        who: &Identity,
        req: &v1::UpdateNodeRequest,
    ) -> Result<v1::UpdateNodeResponse, Status> {
        let drain_only = req.state.eq_ignore_ascii_case("DRAIN");
        let may = if drain_only {
            authz::may_drain_node(who)
        } else {
            authz::may_update_node(who)
        };
        if !may {
            return Err(Status::permission_denied(
                "only an operator (root or admin) may change nodes",
            ));
        }
        let names = tandem_sched::hostlist::expand(&req.nodes)
            .map_err(|e| Status::invalid_argument(format!("nodes: {e}")))?;
        if names.is_empty() {
            return Err(Status::invalid_argument("nodes: none given"));
        }
        for n in &names {
            if self.st.node_by_name(n).is_none() {
                return Err(Status::not_found(format!("unknown node {n:?}")));
            }
        }
        let state = req.state.to_ascii_uppercase();
        let reason = if req.reason.trim().is_empty() {
            format!("set {state} by {}", who.user)
        } else {
            req.reason.clone()
        };
        if !matches!(state.as_str(), "DRAIN" | "RESUME" | "UNDRAIN" | "DOWN") {
            return Err(Status::invalid_argument(format!(
                "state: {:?} is not DRAIN, RESUME, UNDRAIN or DOWN",
                req.state
            )));
        }
        let now = self.now();
        for n in &names {
            let r = match state.as_str() {
                "DRAIN" => self.st.drain(n, &reason),
                // The worker stays attached; the node stays DOWN until resumed.
                "DOWN" => self
                    .st
                    .node_lost(n, &reason, now)
                    .map(|effects| self.apply_effects(effects)),
                _ => {
                    let down = self
                        .st
                        .node_by_name(n)
                        .is_some_and(|x| x.health == Health::Down);
                    let r = self.st.resume(n);
                    if down && r.is_ok() {
                        // A DOWN node comes back when its worker registers: end the
                        // current stream so a live worker re-registers at once.
                        self.workers.lost(n);
                    }
                    r
                }
            };
            r.map_err(|e| Status::invalid_argument(e.to_string()))?;
            self.st.stamp_reason(n, &who.user, now);
        }
        self.pacing.want();
        Ok(v1::UpdateNodeResponse { updated: names })
    }
}
