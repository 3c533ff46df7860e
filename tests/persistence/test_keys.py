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


def _read(event_num, when):
    from spark.zebra import TagRead

    return TagRead("e200", 1, -50.0, 902.75, 10.0, event_num, when)


def test_read_fields_id_is_reader_event_number_and_event_time_in_microseconds():
    from datetime import UTC, datetime

    from persistence.keys import read_fields_read_id

    when = datetime(2026, 11, 21, 10, 0, 0, 123000, tzinfo=UTC)
    assert read_fields_read_id("k", "fx9600-01", 3, _read(77, when)) == (
        "fx9600-01/77/1795255200123000"
    )


def test_read_fields_id_ignores_which_message_carried_the_read():
    from datetime import UTC, datetime

    from persistence.keys import read_fields_read_id

    read = _read(5, datetime(2026, 1, 1, tzinfo=UTC))
    assert read_fields_read_id("one", "r", 0, read) == read_fields_read_id("two", "r", 9, read)


def test_a_read_without_event_number_falls_back_to_the_payload_hash_id():
    from datetime import UTC, datetime

    from persistence.keys import read_fields_read_id

    assert read_fields_read_id("abc", "r", 2, _read(None, datetime.now(UTC))) == "abc:2"
