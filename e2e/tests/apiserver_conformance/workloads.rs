//! The built-in workload controllers: Deployments, ReplicaSets, StatefulSets and Jobs make
//! pods as on a real cluster.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use tandem_e2e::apiserver::Config;

use super::{create, eventually, merge, merge_status, run_ready, start, start_with};

fn template(app: &str, image: &str) -> Value {
    json!({"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": "c", "image": image}]}})
}

async fn pods_with(api: &Api<Pod>, labels: &str, want: usize) -> Vec<Pod> {
    eventually(
        &format!("{want} live pods with {labels}"),
        Duration::from_secs(5),
        || async {
            let pods: Vec<Pod> = api
                .list(&ListParams::default().labels(labels))
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            (pods.len() == want).then_some(pods)
        },
    )
    .await
}

#[tokio::test]
async fn deployments_make_replicasets_that_make_pods() {
    let (_s, client) = start().await;
    let deps: Api<Deployment> = Api::default_namespaced(client.clone());
    let rss: Api<ReplicaSet> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client);
    create(&deps, json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": template("web", "x:1")}})).await;
    let three = pods_with(&pods, "app=web", 3).await;
    let owner = &three[0].metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("ReplicaSet", Some(true))
    );
    assert!(
        three[0]
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key("pod-template-hash")
    );
    assert!(three[0].metadata.name.as_ref().unwrap().starts_with("web-"));
    for p in &three {
        run_ready(&pods, p.metadata.name.as_deref().unwrap()).await;
    }
    eventually(
        "the deployment to report 3 available",
        Duration::from_secs(5),
        || async {
            let st = deps.get("web").await.unwrap().status.unwrap_or_default();
            (st.available_replicas == Some(3) && st.observed_generation == Some(1)).then_some(())
        },
    )
    .await;
    // Settled: the controllers make no further writes (the global version stands still).
    let version = || async {
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .metadata
            .resource_version
    };
    let before = version().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        version().await,
        before,
        "controllers keep writing with nothing to do"
    );
    merge(&deps, "web", json!({"spec": {"replicas": 1}}))
        .await
        .unwrap();
    pods_with(&pods, "app=web", 1).await;
    // A new template: a new ReplicaSet; the old one goes to 0.
    merge(
        &deps,
        "web",
        json!({"spec": {"template": template("web", "x:2")}}),
    )
    .await
    .unwrap();
    let new = pods_with(&pods, "app=web", 1).await;
    assert_eq!(
        new[0].spec.as_ref().unwrap().containers[0].image.as_deref(),
        Some("x:2")
    );
    let sets = rss.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(sets.len(), 2);
    assert_eq!(
        sets.iter()
            .map(|r| r.spec.as_ref().unwrap().replicas.unwrap())
            .sum::<i32>(),
        1
    );
    // Deleting the deployment collects its sets and pods.
    deps.delete("web", &Default::default()).await.unwrap();
    pods_with(&pods, "app=web", 0).await;
}

#[tokio::test]
async fn statefulsets_create_ordinals_in_order_with_claims() {
    let (_s, client) = start().await;
    let sts: Api<StatefulSet> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(client);
    create(&sts, json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
        "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}}, "template": template("db", "x:1"),
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}})).await;
    let first = pods_with(&pods, "app=db", 1).await;
    assert_eq!(first[0].metadata.name.as_deref(), Some("db-0"));
    let spec = first[0].spec.as_ref().unwrap();
    assert_eq!(
        (spec.hostname.as_deref(), spec.subdomain.as_deref()),
        (Some("db-0"), Some("db"))
    );
    assert!(pvcs.get_opt("data-db-0").await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        pods.list(&ListParams::default().labels("app=db"))
            .await
            .unwrap()
            .items
            .len(),
        1,
        "db-1 waits for db-0 to be ready"
    );
    run_ready(&pods, "db-0").await;
    let both = pods_with(&pods, "app=db", 2).await;
    assert!(
        both.iter()
            .any(|p| p.metadata.name.as_deref() == Some("db-1"))
    );
    merge(&sts, "db", json!({"spec": {"replicas": 1}}))
        .await
        .unwrap();
    let left = pods_with(&pods, "app=db", 1).await;
    assert_eq!(
        left[0].metadata.name.as_deref(),
        Some("db-0"),
        "the highest ordinal goes first"
    );
    assert!(
        pvcs.get_opt("data-db-1").await.unwrap().is_some(),
        "claims are kept"
    );
}

#[tokio::test]
async fn jobs_run_to_completion_or_fail_past_the_backoff_limit() {
    let (_s, client) = start().await;
    let jobs: Api<Job> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client);
    let mut t = template("work", "x:1");
    t["spec"]["restartPolicy"] = json!("Never");
    create(
        &jobs,
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "work"},
        "spec": {"parallelism": 2, "completions": 3, "completionMode": "Indexed", "template": t}}),
    )
    .await;
    let two = pods_with(&pods, "job-name=work", 2).await;
    let mut indexes: Vec<String> = two
        .iter()
        .map(|p| {
            p.metadata.annotations.as_ref().unwrap()["batch.kubernetes.io/job-completion-index"]
                .clone()
        })
        .collect();
    indexes.sort();
    assert_eq!(indexes, ["0", "1"]);
    let finish = |name: String| {
        let pods = pods.clone();
        async move {
            merge_status(&pods, &name, json!({"status": {"phase": "Succeeded"}}))
                .await
                .unwrap();
        }
    };
    for p in &two {
        finish(p.metadata.name.clone().unwrap()).await;
    }
    let third = eventually(
        "the third index to start",
        Duration::from_secs(5),
        || async {
            pods.list(&ListParams::default().labels("batch.kubernetes.io/job-completion-index=2"))
                .await
                .unwrap()
                .items
                .into_iter()
                .next()
        },
    )
    .await;
    finish(third.metadata.name.unwrap()).await;
    eventually("the job to complete", Duration::from_secs(5), || async {
        let st = jobs.get("work").await.unwrap().status.unwrap_or_default();
        let complete = st
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True");
        (complete && st.succeeded == Some(3)).then_some(())
    })
    .await;

    let (_s2, client2) = start_with(Config::default()).await;
    let jobs: Api<Job> = Api::default_namespaced(client2.clone());
    let pods: Api<Pod> = Api::default_namespaced(client2);
    let mut t = template("flaky", "x:1");
    t["spec"]["restartPolicy"] = json!("Never");
    create(&jobs, json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "flaky"}, "spec": {"backoffLimit": 1, "template": t}})).await;
    for _ in 0..2 {
        let p = pods_with(&pods, "job-name=flaky,!failed", 1).await;
        let name = p[0].metadata.name.clone().unwrap();
        merge(
            &pods,
            &name,
            json!({"metadata": {"labels": {"failed": "yes"}}}),
        )
        .await
        .unwrap();
        merge_status(&pods, &name, json!({"status": {"phase": "Failed"}}))
            .await
            .unwrap();
    }
    eventually("the job to fail", Duration::from_secs(5), || async {
        let st = jobs.get("flaky").await.unwrap().status.unwrap_or_default();
        st.conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Failed" && c.reason.as_deref() == Some("BackoffLimitExceeded"))
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        pods.list(&ListParams::default().labels("job-name=flaky,!failed"))
            .await
            .unwrap()
            .items
            .is_empty(),
        "no new pod after failing"
    );
}

#[tokio::test]
async fn workload_controllers_can_be_turned_off() {
    let (_s, client) = start_with(Config {
        workload_controllers: false,
        ..Config::default()
    })
    .await;
    let deps: Api<Deployment> = Api::default_namespaced(client.clone());
    create(&deps, json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": template("web", "x:1")}})).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}
