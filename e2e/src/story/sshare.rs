//! Step 6: `sshare` in the login pod, once both teams' usage shows (bridged pods charge
//! their account when their placeholder job ends), and its account rows parsed.

use std::collections::BTreeMap;

use super::manifests::{RESEARCH, SERVING};
use super::print::{say, show};
use super::{Story, StoryError};

impl Story<'_> {
    pub(super) async fn sshare(&self) -> Result<BTreeMap<String, u64>, StoryError> {
        // Bridged pods charge their account when their placeholder job ends; wait until
        // both teams' usage shows.
        let parsed = self
            .poll_login(
                &["tandem", "sshare", "-a", "-P", "-n"],
                "both teams' usage",
                |o| {
                    let u = usage(o);
                    u.get(RESEARCH).is_some_and(|v| *v > 0)
                        && u.get(SERVING).is_some_and(|v| *v > 0)
                },
            )
            .await?;
        say("sshare -a");
        show(&self.login(&["tandem", "sshare", "-a"]).await?);
        Ok(usage(&parsed))
    }
}

/// RawUsage per account from `sshare -a -P -n` (account rows have no user).
fn usage(sshare: &str) -> BTreeMap<String, u64> {
    sshare
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            let account = f.first()?.trim();
            let user = f.get(1)?.trim();
            let raw = f.get(4)?.trim().parse().ok()?;
            (user.is_empty() && !account.is_empty()).then(|| (account.to_owned(), raw))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_takes_account_rows_only() {
        let s = "root||1|1.000000|90|1.000000|0.5\n research||60|0.6|80|0.8|0.4\n  research|root|1|1.0|80|1.0|0.4\n serving||40|0.4|10|0.1|0.9\n";
        let u = usage(s);
        assert_eq!(u.get("research"), Some(&80));
        assert_eq!(u.get("serving"), Some(&10));
        assert_eq!(u.get("root"), Some(&90));
        assert_eq!(u.len(), 3);
    }
}
