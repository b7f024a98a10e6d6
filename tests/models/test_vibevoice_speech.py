"""The vibevoice family end to end: a tiny VibeVoice folder (LM + acoustic decoder workers) served as `omni-run --model DIR` serves it.

The checks are the shared ones (speech_family.py), driven by the openai SDK; one server for the module.
"""

from __future__ import annotations

from tests.models.speech_family import (  # noqa: F401 - the shared tests, collected here
    Family,
    family_fixtures,
    test_audio_at_the_family_rate_deterministic_for_a_seed,
    test_bad_voice_instructions_and_sizes_are_400s,
    test_custom_voices_clone_and_survive_a_restart,
    test_detected_served_and_voices_listed,
    test_every_format_decodes,
    test_plain_streaming_sends_encoded_bytes,
    test_speed_changes_duration,
    test_sse_deltas_arrive_before_done,
    test_text_in_socket_closed_mid_text_leaves_nothing_running,
    test_text_in_socket_speaks_before_done_in_order,
)

FAMILY = Family("vibevoice", rate=24000, frame=3200, voices=("0", "1", "2", "3"))
fam, model_dir, data_dir, srv = family_fixtures(FAMILY)
