//! Step 2: installing Tandem as a platform team would, `helm install` of the four charts
//! (rendered by real Helm, every object created, remembered for uninstall), and the check
//! that every object they made exists.
//!
//! On the harness the operator and bridge Deployments are installed at 0 replicas and their
//! containers' command lines, taken from the rendered charts, run here as processes with a
//! kubeconfig: the harness serves plain HTTP and mounts no service-account token.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject};
use serde_json::json;

use super::manifests::{CLUSTER, RESEARCH, SERVING};
use super::print::{say, show};
use super::procs::Proc;
use super::values::{self, LOGIN_SET, WORKER_SET};
use super::{
    POOL, Release, START_WORKERS, Story, StoryError, failed, helm, io_err, kit_err, kube_err,
};

impl Story<'_> {
    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    pub(super) async fn install(&mut self) -> Result<(), StoryError> {
        let server = self
            .cluster
            .server()
            .ok_or_else(|| failed("install", "the story needs the in-repo API server"))?
            .url();
        std::fs::write(
            self.kubeconfig(),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: harness\n  cluster:\n    server: {server}\n\
                 contexts:\n- name: harness\n  context:\n    cluster: harness\n    user: harness\n\
                 current-context: harness\nusers:\n- name: harness\n  user: {{}}\n"
            ),
        )
        .map_err(io_err("writing the kubeconfig"))?;
        self.namespaces().await?;
        let rendered = self.install_crds_and_operator().await?;
        // The harness serves plain HTTP and mounts no service-account token, so an
        // in-cluster client cannot reach it: the Deployment is installed at 0 replicas and
        // its container runs here as a process, with the chart's own command line.
        let argv = deployment_argv(&rendered, "tandem-operator")?;
        println!("running the chart's container here: {}", argv.join(" "));
        let kubeconfig = self.kubeconfig();
        let args: Vec<&str> = argv.iter().skip(1).map(String::as_str).collect();
        let bins = self.bins.ok_or_else(|| failed("install", "no binaries"))?;
        self.operator = Some(
            Proc::spawn(
                &bins.operator,
                &args,
                &[("KUBECONFIG", &kubeconfig)],
                self.dir.path().join("operator.log"),
            )
            .map_err(io_err("starting tandem-operator"))?,
        );

        self.install_cluster().await?;
        self.wait_ready("WorkerSet", "workersets", WORKER_SET, START_WORKERS)
            .await?;
        self.wait_ready("LoginSet", "loginsets", LOGIN_SET, 1)
            .await?;
        say(&format!("kubectl -n {} get pods -o wide", self.ns));
        show(&self.pods_table(&self.ns).await?);

        self.start_bridge().await?;
        self.check_installed().await?;
        say(&format!(
            "kubectl exec {LOGIN_SET}-0 -- sinfo -N -o '%N %P %t %k'"
        ));
        show(&self.login(&["sinfo", "-N", "-o", "%N %P %t %k"]).await?);
        Ok(())
    }

    /// The namespace Tandem goes in and the serving team's, new ones each run.
    async fn namespaces(&mut self) -> Result<(), StoryError> {
        self.ns = self
            .cluster
            .namespace("tandem")
            .await
            .map_err(kit_err("namespace tandem"))?;
        self.serving = self
            .cluster
            .namespace("serving")
            .await
            .map_err(kit_err("namespace serving"))?;
        println!(
            "namespaces: {} (Tandem), {} (the serving team)",
            self.ns, self.serving
        );
        Ok(())
    }

    /// `helm install` of `tandem-crds` and `tandem-operator`; what the operator chart
    /// rendered.
    async fn install_crds_and_operator(&mut self) -> Result<helm::Rendered, StoryError> {
        self.python = Some(helm::python().map_err(|e| failed("helm", format!("{e:#}")))?);
        say("helm install tandem-crds charts/tandem-crds");
        self.helm_install("tandem-crds", "tandem-crds", json!({}))
            .await?;
        say(&format!(
            "helm install tandem-operator charts/tandem-operator -n {} (watchNamespace {0})",
            self.ns
        ));
        let image = values::image(&crate::testkit::tandem_image());
        self.helm_install(
            "tandem-operator",
            "tandem-operator",
            values::operator(&image, &self.ns),
        )
        .await
    }

    /// `helm install tandem-cluster` with the story's values.
    async fn install_cluster(&mut self) -> Result<(), StoryError> {
        say(&format!(
            "helm install tandem-cluster charts/tandem-cluster -n {}: TandemCluster {CLUSTER} \
             (accounts {RESEARCH} 60, {SERVING} 40; namespace {} -> {SERVING}), WorkerSet \
             {WORKER_SET} x{START_WORKERS} of {} with an HPA up to {2}, LoginSet {LOGIN_SET}",
            self.ns, self.serving, POOL.nodes
        ));
        let v = values::cluster(POOL, START_WORKERS, &self.serving, &crate_user());
        let rendered = self
            .helm_install("tandem-cluster", "tandem-cluster", v)
            .await?;
        show(&rendered.notes);
        Ok(())
    }

    /// `helm install tandem-bridge` for the cluster `CLUSTER`.
    async fn install_bridge(&mut self) -> Result<helm::Rendered, StoryError> {
        say(&format!(
            "helm install tandem-bridge charts/tandem-bridge -n {} (cluster.name {CLUSTER})",
            self.ns
        ));
        let image = values::image(&crate::testkit::tandem_image());
        self.helm_install("tandem-bridge", "tandem-bridge", values::bridge(&image))
            .await
    }

    /// The four installs alone, no process started (a real cluster).
    pub(super) async fn install_charts(&mut self) -> Result<(), StoryError> {
        self.namespaces().await?;
        self.install_crds_and_operator().await?;
        self.install_cluster().await?;
        self.install_bridge().await?;
        Ok(())
    }

    /// Fails unless every object the releases made exists.
    pub(super) async fn check_installed(&self) -> Result<(), StoryError> {
        let mut missing = Vec::new();
        let mut n = 0;
        for m in self.releases.iter().flat_map(|r| &r.made) {
            n += 1;
            if m.api(&self.client)
                .get_opt(&m.name)
                .await
                .map_err(kube_err("read a release's object"))?
                .is_none()
            {
                missing.push(m.describe());
            }
        }
        if !missing.is_empty() {
            return Err(failed("helm install", format!("missing: {missing:?}")));
        }
        say(&format!(
            "helm status: all {n} objects of {} releases exist",
            self.releases.len()
        ));
        Ok(())
    }

    /// The bridge, as its chart runs it: the controller endpoint from the cluster's
    /// status, the cluster key and CA from the Secrets the operator made.
    async fn start_bridge(&mut self) -> Result<(), StoryError> {
        let tc = self.api("TandemCluster", "tandemclusters");
        let endpoint = self
            .poll("the TandemCluster's controllerEndpoint", || async {
                let o = tc
                    .get(CLUSTER)
                    .await
                    .map_err(kube_err("read TandemCluster"))?;
                Ok(o.data["status"]["controllerEndpoint"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| "no endpoint yet".to_owned()))
            })
            .await?;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.ns);
        let key = secret_file(&secrets, &format!("{CLUSTER}-key"), "cluster.key").await?;
        let ca = secret_file(&secrets, &format!("{CLUSTER}-ca"), "ca.crt").await?;
        let key_file = self.dir.path().join("cluster.key");
        let ca_file = self.dir.path().join("ca.crt");
        write_private(&key_file, &key)?;
        write_private(&ca_file, &ca)?;
        let rendered = self.install_bridge().await?;
        // As for the operator: the chart's command line, run here. The Secrets' files are
        // written where the mounts would put them, and the controller's Service name
        // becomes the endpoint the cluster's status gives (no cluster DNS here).
        let (k, c) = (
            key_file.to_string_lossy().into_owned(),
            ca_file.to_string_lossy().into_owned(),
        );
        let mut argv = deployment_argv(&rendered, "tandem-bridge")?;
        for a in argv.iter_mut() {
            *a = a
                .replace("/etc/tandem/key/cluster.key", &k)
                .replace("/etc/tandem/ca/ca.crt", &c);
        }
        if let Some(i) = argv.iter().position(|a| a == "--controller")
            && let Some(v) = argv.get_mut(i + 1)
        {
            v.clone_from(&endpoint);
        }
        println!("running the chart's container here: {}", argv.join(" "));
        let args: Vec<&str> = argv.iter().skip(1).map(String::as_str).collect();
        let kubeconfig = self.kubeconfig();
        let bins = self.bins.ok_or_else(|| failed("install", "no binaries"))?;
        self.bridge = Some(
            Proc::spawn(
                &bins.bridge,
                &args,
                &[("KUBECONFIG", &kubeconfig)],
                self.dir.path().join("bridge.log"),
            )
            .map_err(io_err("starting tandem-bridge"))?,
        );
        Ok(())
    }

    /// `helm install`: renders `chart` as `release` in the story's namespace and creates
    /// every object (then the post-install hooks), remembering them for uninstall.
    async fn helm_install(
        &mut self,
        chart: &str,
        release: &str,
        values: serde_json::Value,
    ) -> Result<helm::Rendered, StoryError> {
        let python = self
            .python
            .clone()
            .ok_or_else(|| failed("helm", "no venv"))?;
        let rendered = helm::render(&python, chart, release, &self.ns, &values)
            .map_err(|e| failed(format!("helm install {release}"), format!("{e:#}")))?;
        let step = format!("helm install {release}");
        self.releases.push(Release {
            name: release.to_owned(),
            made: Vec::new(),
        });
        let mut crds = Vec::new();
        for obj in rendered.objects.iter().chain(&rendered.hooks) {
            let is_crd = obj
                .types
                .as_ref()
                .is_some_and(|t| t.kind == "CustomResourceDefinition");
            let made = match helm::create(&self.client, &self.ns, obj).await {
                Ok(made) => made,
                // Helm installs crds/ only when they are missing (a real cluster may have
                // them from an earlier install).
                Err(kube::Error::Api(e)) if is_crd && e.code == 409 => {
                    println!(
                        "CustomResourceDefinition/{} exists already",
                        obj.metadata.name.as_deref().unwrap_or_default()
                    );
                    crds.push(obj);
                    continue;
                }
                Err(e) => return Err(kube_err(&step)(e)),
            };
            println!("{} created", made.describe());
            if is_crd {
                // CRDs in a chart's crds/ folder stay after `helm uninstall` (Helm's rule).
                crds.push(obj);
            } else if let Some(r) = self.releases.last_mut() {
                r.made.push(made);
            }
        }
        for crd in crds {
            self.wait_served(crd).await?;
        }
        Ok(rendered)
    }

    /// Waits until discovery serves the kind `crd` defines (a real API server takes a
    /// moment to establish a new CRD).
    async fn wait_served(&self, crd: &DynamicObject) -> Result<(), StoryError> {
        let spec = &crd.data["spec"];
        let version = spec["versions"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["served"] == true))
            .and_then(|v| v["name"].as_str())
            .unwrap_or_default();
        let gvk = kube::api::GroupVersionKind::gvk(
            spec["group"].as_str().unwrap_or_default(),
            version,
            spec["names"]["kind"].as_str().unwrap_or_default(),
        );
        let what = format!("{}/{} to be served", gvk.group, gvk.kind);
        self.poll(&what, || async {
            Ok(kube::discovery::pinned_kind(&self.client, &gvk)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()))
        })
        .await
    }
}

/// The command line of the Deployment `name` in a rendered chart.
fn deployment_argv(rendered: &helm::Rendered, name: &str) -> Result<Vec<String>, StoryError> {
    rendered
        .objects
        .iter()
        .find(|o| {
            o.types.as_ref().is_some_and(|t| t.kind == "Deployment")
                && o.metadata.name.as_deref() == Some(name)
        })
        .map(|d| helm::argv(&helm::first_container(d).0))
        .filter(|a| !a.is_empty())
        .ok_or_else(|| failed("helm install", format!("no Deployment {name} rendered")))
}

/// The user the login pod's commands run as (exec keeps the harness's uid).
fn crate_user() -> String {
    let uid = nix::unistd::getuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name)
}

async fn secret_file(secrets: &Api<Secret>, name: &str, key: &str) -> Result<Vec<u8>, StoryError> {
    let s = secrets
        .get(name)
        .await
        .map_err(kube_err(&format!("read Secret {name}")))?;
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .ok_or_else(|| failed(format!("Secret {name}"), format!("has no {key}")))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), StoryError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("writing a key file"))?;
    f.write_all(bytes).map_err(io_err("writing a key file"))
}
