from persistence.keys import message_key, read_id

TOPIC = "zebra/fx/fx9600-01/reads"


def test_message_key_is_the_first_32_hex_digits_of_sha256_of_topic_nul_payload():
    # printf 'zebra/fx/fx9600-01/reads\0{}' | sha256sum
    assert message_key(TOPIC, b"{}") == "accde58c1ed7ef9553d523433057d215"


def test_message_key_of_empty_topic_and_payload_hashes_the_separator_alone():
    # printf '\0' | sha256sum
    assert message_key("", b"") == "6e340b9cffb37a989ca544e6bb780a2c"


def test_message_key_is_stable_across_calls():
    assert message_key(TOPIC, b'{"a":1}') == message_key(TOPIC, b'{"a":1}')


def test_message_key_depends_on_the_topic():
    assert message_key(TOPIC, b"{}") != message_key("zebra/fx/fx9600-02/reads", b"{}")


def test_message_key_depends_on_the_payload():
    assert message_key(TOPIC, b'{"a":1}') != message_key(TOPIC, b'{"a":2}')


def test_separator_keeps_topic_and_payload_boundaries_apart():
    assert message_key("a/b", b"c") != message_key("a/bc", b"")


def test_read_id_suffixes_the_message_key_with_the_read_index():
    assert read_id("accde58c1ed7ef9553d523433057d215", 0) == "accde58c1ed7ef9553d523433057d215:0"
    assert read_id("k", 12) == "k:12"
