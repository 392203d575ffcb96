//! New files from S3 event notifications: the bucket sends
//! `s3:ObjectCreated:*` events to an SQS queue (directly, or through SNS);
//! a run reads a bounded number of messages, loads the files they name
//! and deletes the messages only once the run is recorded. A message that is
//! not deleted (the runner died) comes back after the queue's visibility
//! timeout; the file log keeps the file from loading twice.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::ingest::SourceOptions;
use crate::ingest::source::Access;

/// Receive calls per run (each takes at most 10 messages).
const MAX_RECEIVES: usize = 10;

/// The messages one run read.
#[derive(Debug)]
pub(crate) struct Notifications {
    /// Object keys of created objects, in the watched bucket.
    pub(crate) keys: Vec<String>,
    receipts: Vec<String>,
    client: aws_sdk_sqs::Client,
    queue: String,
}

impl Notifications {
    /// Reads what is waiting in `queue` (up to 100 messages) for the
    /// bucket of `access`.
    pub(crate) async fn receive(
        access: &Access,
        queue: &str,
        options: &SourceOptions,
    ) -> Result<Self> {
        let (Some(sdk), crate::ingest::source::Location::S3 { bucket, .. }) =
            (&access.sdk, &access.location)
        else {
            return Err(Error::invalid(format!(
                "notification_queue '{queue}' needs an s3:// prefix: leave it out to find new files by listing"
            )));
        };
        let mut config = aws_sdk_sqs::config::Builder::from(sdk);
        if let Some(endpoint) = &options.endpoint {
            config = config.endpoint_url(endpoint);
        }
        let client = aws_sdk_sqs::Client::from_conf(config.build());
        let mut keys = vec![];
        let mut receipts = vec![];
        for _ in 0..MAX_RECEIVES {
            let answer = client
                .receive_message()
                .queue_url(queue)
                .max_number_of_messages(10)
                .wait_time_seconds(0)
                .send()
                .await
                .map_err(|e| {
                    Error::invalid(format!(
                        "reading notification queue '{queue}' as {} failed: {}: grant sqs:ReceiveMessage \
                         and sqs:DeleteMessage on it, or check the URL",
                        access.identity,
                        aws_sdk_sqs::error::DisplayErrorContext(&e)
                    ))
                })?;
            let messages = answer.messages.unwrap_or_default();
            if messages.is_empty() {
                break;
            }
            for message in messages {
                keys.extend(created_keys(message.body().unwrap_or_default(), bucket));
                if let Some(receipt) = message.receipt_handle {
                    receipts.push(receipt);
                }
            }
        }
        Ok(Self {
            keys,
            receipts,
            client,
            queue: queue.to_string(),
        })
    }

    /// Deletes the messages read, 10 at a time.
    pub(crate) async fn delete(self) -> Result<()> {
        for chunk in self.receipts.chunks(10) {
            let mut batch = self.client.delete_message_batch().queue_url(&self.queue);
            for (n, receipt) in chunk.iter().enumerate() {
                batch = batch.entries(
                    aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                        .id(n.to_string())
                        .receipt_handle(receipt)
                        .build()
                        .map_err(|e| Error::internal(format!("a delete entry: {e}")))?,
                );
            }
            batch.send().await.map_err(|e| {
                Error::invalid(format!(
                    "deleting messages from notification queue '{}' failed: {}",
                    self.queue,
                    aws_sdk_sqs::error::DisplayErrorContext(&e)
                ))
            })?;
        }
        Ok(())
    }
}

/// The keys of objects created in `bucket` that an S3 event notification
/// (or an SNS envelope holding one) names; anything else (test events,
/// other buckets, deletions, text that is not JSON) names none.
pub(crate) fn created_keys(body: &str, bucket: &str) -> Vec<String> {
    let Ok(mut event) = serde_json::from_str::<Value>(body) else {
        return vec![];
    };
    if let Some(inner) = event.get("Message").and_then(Value::as_str) {
        match serde_json::from_str::<Value>(inner) {
            Ok(parsed) => event = parsed,
            Err(_) => return vec![],
        }
    }
    let Some(records) = event.get("Records").and_then(Value::as_array) else {
        return vec![];
    };
    records
        .iter()
        .filter(|r| {
            r.get("eventName")
                .and_then(Value::as_str)
                .is_some_and(|n| n.starts_with("ObjectCreated"))
                && r.pointer("/s3/bucket/name").and_then(Value::as_str) == Some(bucket)
        })
        .filter_map(|r| r.pointer("/s3/object/key").and_then(Value::as_str))
        .map(decode_key)
        .collect()
}

/// Event keys are URL-encoded, with `+` for a space.
fn decode_key(key: &str) -> String {
    let spaced = key.replace('+', " ");
    url::form_urlencoded::parse(format!("k={}", spaced.replace(' ', "%20")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or(spaced)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_created_objects_in_the_bucket() {
        let event = r#"{"Records":[
            {"eventName":"ObjectCreated:Put","s3":{"bucket":{"name":"landing"},"object":{"key":"in/day+1/a%3Db.csv","size":3}}},
            {"eventName":"ObjectRemoved:Delete","s3":{"bucket":{"name":"landing"},"object":{"key":"in/gone.csv"}}},
            {"eventName":"ObjectCreated:Copy","s3":{"bucket":{"name":"other"},"object":{"key":"in/x.csv"}}}
        ]}"#;
        assert_eq!(created_keys(event, "landing"), vec!["in/day 1/a=b.csv"]);
        let wrapped = serde_json::json!({"Type": "Notification", "Message": event}).to_string();
        assert_eq!(created_keys(&wrapped, "landing"), vec!["in/day 1/a=b.csv"]);
        assert!(created_keys(r#"{"Event":"s3:TestEvent"}"#, "landing").is_empty());
        assert!(created_keys("not json", "landing").is_empty());
    }
}
