-- The ledger's schema as fxgate wrote it before files recorded their version (version 1):
-- payloads in the row, no forward mark. Used to build a file of the previous schema for the
-- migration tests; do not edit (it is what is on the gateways in the field).
CREATE TABLE inbound (
	seq INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
	message_key VARCHAR NOT NULL,
	topic VARCHAR NOT NULL,
	payload BLOB,
	qos INTEGER NOT NULL,
	packet_id INTEGER,
	received_time FLOAT NOT NULL,
	pack_id INTEGER,
	batch_id INTEGER,
	landed_time FLOAT,
	dead_reason VARCHAR,
	expires_at FLOAT,
	UNIQUE (message_key)
);
CREATE INDEX inbound_landed_time ON inbound (landed_time);
CREATE INDEX inbound_batch_id ON inbound (batch_id);
CREATE INDEX inbound_packet_id ON inbound (packet_id) WHERE packet_id IS NOT NULL;
CREATE TABLE batches (
	batch_id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
	state VARCHAR NOT NULL,
	started_time FLOAT NOT NULL,
	committed_time FLOAT,
	messages INTEGER NOT NULL,
	rows INTEGER,
	dead_letters INTEGER
);
CREATE TABLE read_claims (
	message_id VARCHAR NOT NULL,
	batch_id INTEGER NOT NULL,
	claimed_time FLOAT NOT NULL,
	PRIMARY KEY (message_id)
);
CREATE INDEX read_claims_batch_id ON read_claims (batch_id);
CREATE INDEX read_claims_claimed_time ON read_claims (claimed_time);
CREATE TABLE counters (
	name VARCHAR NOT NULL,
	value INTEGER NOT NULL,
	PRIMARY KEY (name)
);
