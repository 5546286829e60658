//! The controller's `tandem.v1.Jobs` server with `ListJobs` answered from bytes encoded
//! beforehand.
//!
//! A squeue over a long queue is a 15-30 MB reply. Encoded by tonic, that work (and freeing
//! the decoded jobs afterwards) lands on the async workers that also answer `sbatch`; the
//! controller's listing threads run at the lowest CPU priority, so it encodes there instead
//! and hands tonic finished bytes. Only the server's type differs: on the wire the reply is
//! a `ListJobsResponse`, and clients decode it as one.

use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};

/// A `tandem.v1.ListJobsResponse` already encoded (its body, without gRPC framing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedListJobs(pub Vec<u8>);

impl EncodedListJobs {
    /// Encodes `resp`, consuming it so that its jobs are freed here too.
    pub fn encode(resp: crate::v1::ListJobsResponse) -> Self {
        Self(prost::Message::encode_to_vec(&resp))
    }
}

impl prost::Message for EncodedListJobs {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.0);
    }

    // Only ever sent, never decoded: a decode skips every field.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

mod generated {
    #![allow(clippy::all, missing_docs, unreachable_pub)]
    include!(concat!(env!("OUT_DIR"), "/listing/tandem.v1.rs"));
}

pub use generated::jobs_server;

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::v1;

    #[test]
    fn an_encoded_listing_decodes_as_the_response_it_was_made_from() {
        let resp = v1::ListJobsResponse {
            jobs: vec![
                v1::JobInfo {
                    job_id: 7,
                    name: "train".into(),
                    ..Default::default()
                },
                v1::JobInfo {
                    job_id: 8,
                    ..Default::default()
                },
            ],
            now: 1_700_000_000,
        };
        let enc = EncodedListJobs::encode(resp.clone());
        let mut framed = Vec::new();
        enc.encode(&mut framed).unwrap();
        assert_eq!(framed.len(), enc.encoded_len());
        assert_eq!(
            v1::ListJobsResponse::decode(framed.as_slice()).unwrap(),
            resp
        );
    }
}
