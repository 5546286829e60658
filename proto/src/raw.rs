//! A gRPC codec that sends and receives message bodies as raw bytes, unparsed: what the
//! decoder property tests use to put arbitrary bytes on the wire to a real server (a
//! generated client can only send messages that encode).

use prost::bytes::{Buf as _, BufMut as _};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut out = Vec::with_capacity(buf.remaining());
        while buf.has_remaining() {
            let chunk = buf.chunk();
            out.extend_from_slice(chunk);
            let n = chunk.len();
            buf.advance(n);
        }
        Ok(Some(out))
    }
}

/// Sends `body` as the one request message of `path` (`/tandem.v1.Jobs/Submit`) over
/// `channel` and returns the first reply message or the status. Works for unary and
/// streaming methods alike (on the wire a unary call is a stream of one).
pub async fn call<T>(channel: T, path: &'static str, body: Vec<u8>) -> Result<Vec<u8>, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = prost::bytes::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("not ready: {}", e.into())))?;
    let request = tonic::Request::new(tonic::codegen::tokio_stream::once(body));
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    let mut replies = grpc.streaming(request, path, RawCodec).await?.into_inner();
    Ok(replies.message().await?.unwrap_or_default())
}
