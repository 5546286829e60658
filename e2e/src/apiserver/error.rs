//! API errors as a real server reports them: an HTTP status plus a `meta/v1` `Status` body.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One field-level problem inside a 422 `Invalid` error (`Status.details.causes[]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueForbidden`, ...
    pub reason: String,
    pub message: String,
    /// Dotted path as the real server writes it (`spec.replicas`, `metadata.name`).
    pub field: String,
}

impl Cause {
    pub fn new(reason: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: reason.to_owned(),
            message: message.into(),
            field: field.into(),
        }
    }
}

/// An error answered to a client. Every handler returns this, so every failure has a real
/// `Status` body with `reason`, `code` and, where the server names one, `details`.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    /// `NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, `Expired`, `BadRequest`, ...
    pub reason: &'static str,
    pub message: String,
    /// Boxed: most errors have none, and `Result<_, ApiError>` stays small.
    pub details: Option<Box<Details>>,
}

/// `Status.details`: which object, and for 422 the field causes.
#[derive(Clone, Debug, Default)]
pub struct Details {
    pub group: String,
    /// The resource plural (`pods`), or the kind for 422 errors, as the real server fills it.
    pub kind: String,
    pub name: String,
    pub causes: Vec<Cause>,
}

/// Short form used everywhere in the server.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// `pods "x" not found` (the resource is the plural, optionally `plural.group`).
    pub fn not_found(resource: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{resource} \"{name}\" not found")).about(resource, name)
    }

    pub fn already_exists(resource: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{resource} \"{name}\" already exists"),
        )
        .about(resource, name)
    }

    /// The optimistic-concurrency failure, worded as the real server words it.
    pub fn conflict(resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {resource} \"{name}\": {why}"),
        )
        .about(resource, name)
    }

    pub fn stale(resource: &str, name: &str) -> Self {
        Self::conflict(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with field causes; the message lists them like the real server does.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> Self {
        let detail: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let mut e = Self::new(
            422,
            "Invalid",
            format!(
                "{kind}.{group} \"{name}\" is invalid: {}",
                detail.join(", ")
            ),
        );
        if group.is_empty() {
            e.message = format!("{kind} \"{name}\" is invalid: {}", detail.join(", "));
        }
        e.details = Some(Box::new(Details {
            group: group.to_owned(),
            kind: kind.to_owned(),
            name: name.to_owned(),
            causes,
        }));
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub fn unsupported_media(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// Fills `details.name` and `details.kind` (the resource plural, as the real server does).
    fn about(mut self, resource: &str, name: &str) -> Self {
        let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
        self.details = Some(Box::new(Details {
            group: group.to_owned(),
            kind: plural.to_owned(),
            name: name.to_owned(),
            causes: Vec::new(),
        }));
        self
    }

    /// The 422 causes, if any.
    pub fn causes(&self) -> &[Cause] {
        self.details.as_ref().map_or(&[], |d| &d.causes)
    }

    /// The `Status` object; also used as the payload of a watch `ERROR` event.
    pub fn status_body(&self) -> Value {
        let mut details = serde_json::Map::new();
        if let Some(d) = &self.details {
            if !d.name.is_empty() {
                details.insert("name".into(), json!(d.name));
            }
            if !d.group.is_empty() {
                details.insert("group".into(), json!(d.group));
            }
            if !d.kind.is_empty() {
                details.insert("kind".into(), json!(d.kind));
            }
            if !d.causes.is_empty() {
                let causes: Vec<Value> = d
                    .causes
                    .iter()
                    .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                    .collect();
                details.insert("causes".into(), Value::Array(causes));
            }
        }
        let mut body = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if !details.is_empty() {
            body["details"] = Value::Object(details);
        }
        body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, axum::Json(self.status_body())).into_response()
    }
}
