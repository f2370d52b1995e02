// Hugging Face safetensors files (core/io/safetensors.h): round trips of every fp32/bf16/fp16/fp8
// bit pattern, the writer's bytes against HF's own library, shards and their index, every
// malformed file and set built byte by byte, and 2000 random mutations of a valid file.
//
// The golden bytes below come from the Python package safetensors 0.8.0 (not a dependency of the
// build or the tests), made with
//   safetensors.serialize({name: TensorSpec(dtype=.., shape=.., data_ptr=.., data_len=..)},
//                         metadata={"format": "pt"})
// over the tensors of golden_tensors() (data bytes (k*31 + j*7 + 3) % 256 for tensor k, byte j),
// and the index text from json.dumps(index, indent=2, sort_keys=True) + "\n", as transformers
// writes it.
#include "core/io/safetensors.h"

#include "core/base/dtype.h"
#include "core/base/error.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

using namespace px;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A fresh folder, removed with everything in it.
struct TempDir {
    fs::path path;
    TempDir() {
        static int n = 0;
        path = fs::temp_directory_path() /
               ("px_test_st_" + std::to_string(getpid()) + "_" + std::to_string(n++));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

void put_file(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), std::streamsize(bytes.size()));
    REQUIRE(f.good());
}

std::string get_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string from_hex(const std::string& hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
        out += char(std::stoi(hex.substr(i, 2), nullptr, 16));
    return out;
}

// A file built byte by byte: the 8-byte little-endian length, the header as given, the data.
std::string st_bytes(const std::string& header, const std::string& data = "",
                     std::optional<u64> claimed = std::nullopt) {
    const u64 n = claimed ? *claimed : u64(header.size());
    std::string out(8, '\0');
    std::memcpy(out.data(), &n, 8);
    return out + header + data;
}

// The message of the exception f throws, which must be an E.
template <class E, class F>
std::string thrown(F&& f) {
    try {
        f();
    } catch (const E& e) {
        return e.what();
    } catch (const std::exception& e) {
        FAIL("threw the wrong type: " << e.what());
    }
    FAIL("threw nothing");
    return "";
}

struct Golden {
    std::string name;
    SafeDType dtype;
    std::vector<i64> shape;
    std::string data;
};

std::vector<Golden> golden_tensors() {
    std::vector<Golden> t = {
        {"wte", SafeDType::F32, {3, 2}, ""},
        {"h.0.ln_1.weight", SafeDType::BF16, {4}, ""},
        {"h.0.attn.bias", SafeDType::F16, {2, 2}, ""},
        {"lm_head.weight", SafeDType::F32, {2}, ""},
        {"step", SafeDType::I64, {}, ""},
        {"empty", SafeDType::F32, {0, 3}, ""},
        {"\xc3\xa9\n\"q", SafeDType::F16, {1}, ""},
        {"a", SafeDType::BF16, {1}, ""},
        {"mask", SafeDType::BOOL, {3}, ""},
        {"scale", SafeDType::F8_E4M3, {2}, ""},
    };
    for (size_t k = 0; k < t.size(); k++) {
        i64 n = safe_dtype_bits(t[k].dtype) / 8;
        for (i64 d : t[k].shape) n *= d;
        for (i64 j = 0; j < n; j++) t[k].data += char((i64(k) * 31 + j * 7 + 3) % 256);
    }
    return t;
}

std::vector<SafetensorsData> data_of(const std::vector<Golden>& g) {
    std::vector<SafetensorsData> out;
    for (const Golden& t : g)
        out.push_back({t.name, t.dtype, t.shape, t.data.data(), t.data.size()});
    return out;
}

// safetensors 0.8.0, metadata {"format": "pt"}, all of golden_tensors().
const char* const kGoldenPt =
    "90020000000000007b225f5f6d657461646174615f5f223a7b22666f726d6174223a227074227d2c22737465"
    "70223a7b226474797065223a22493634222c227368617065223a5b5d2c22646174615f6f666673657473223a"
    "5b302c385d7d2c22656d707479223a7b226474797065223a22463332222c227368617065223a5b302c335d2c"
    "22646174615f6f666673657473223a5b382c385d7d2c226c6d5f686561642e776569676874223a7b22647479"
    "7065223a22463332222c227368617065223a5b325d2c22646174615f6f666673657473223a5b382c31365d7d"
    "2c22777465223a7b226474797065223a22463332222c227368617065223a5b332c325d2c22646174615f6f66"
    "6673657473223a5b31362c34305d7d2c2261223a7b226474797065223a2242463136222c227368617065223a"
    "5b315d2c22646174615f6f666673657473223a5b34302c34325d7d2c22682e302e6c6e5f312e776569676874"
    "223a7b226474797065223a2242463136222c227368617065223a5b345d2c22646174615f6f66667365747322"
    "3a5b34322c35305d7d2c22682e302e6174746e2e62696173223a7b226474797065223a22463136222c227368"
    "617065223a5b322c325d2c22646174615f6f666673657473223a5b35302c35385d7d2c22c3a95c6e5c227122"
    "3a7b226474797065223a22463136222c227368617065223a5b315d2c22646174615f6f666673657473223a5b"
    "35382c36305d7d2c227363616c65223a7b226474797065223a2246385f45344d33222c227368617065223a5b"
    "325d2c22646174615f6f666673657473223a5b36302c36325d7d2c226d61736b223a7b226474797065223a22"
    "424f4f4c222c227368617065223a5b335d2c22646174615f6f666673657473223a5b36322c36355d7d7d2020"
    "202020207f868d949ba2a9b060676e757c838a91030a11181f262d343b424950575e656c737a81888f969da4"
    "dce3222930373e454c5341484f565d646b72bdc41a21fb0209";
// safetensors 0.8.0, metadata None, the first three of golden_tensors().
const char* const kGoldenNoMetadata =
    "c8000000000000007b22777465223a7b226474797065223a22463332222c227368617065223a5b332c325d2c"
    "22646174615f6f666673657473223a5b302c32345d7d2c22682e302e6c6e5f312e776569676874223a7b2264"
    "74797065223a2242463136222c227368617065223a5b345d2c22646174615f6f666673657473223a5b32342c"
    "33325d7d2c22682e302e6174746e2e62696173223a7b226474797065223a22463136222c227368617065223a"
    "5b322c325d2c22646174615f6f666673657473223a5b33322c34305d7d7d2020030a11181f262d343b424950"
    "575e656c737a81888f969da4222930373e454c5341484f565d646b72";

// Every tensor of f read, raw and (where it converts) as fp32; the entries tile the data.
void read_everything(const SafetensorsFile& f) {
    u64 at = 0;
    for (const SafetensorsEntry& e : f.entries()) {
        REQUIRE(e.begin == at);
        at = e.end;
        REQUIRE(f.read_raw(e.name).size() == e.bytes());
        if (px_dtype_of(e.dtype)) REQUIRE(f.read_f32(e.name).size() == size_t(e.numel()));
    }
    REQUIRE(8 + f.header_bytes() + at == f.file_bytes());
}

}  // namespace

TEST_CASE("safetensors: fp32, bf16, fp16 and fp8 tensors round trip bit for bit", "[safetensors]") {
    TempDir dir;
    const std::vector<float> f32 = {0.0f,
                                    -0.0f,
                                    1.0f,
                                    -2.5f,
                                    std::numeric_limits<float>::infinity(),
                                    -std::numeric_limits<float>::infinity(),
                                    std::bit_cast<float>(0x7fc00001u),  // a NaN with a payload
                                    std::numeric_limits<float>::denorm_min(),
                                    std::numeric_limits<float>::max(),
                                    3.0e-39f};
    std::vector<std::uint16_t> all16(65536);
    for (size_t i = 0; i < all16.size(); i++) all16[i] = std::uint16_t(i);
    std::vector<std::uint8_t> all8(256);
    for (size_t i = 0; i < all8.size(); i++) all8[i] = std::uint8_t(i);

    const std::string path = dir.file("model.safetensors");
    write_safetensors(path, {{"f32", SafeDType::F32, {2, 5}, f32.data(), 40},
                             {"bf16", SafeDType::BF16, {256, 256}, all16.data(), 131072},
                             {"f16", SafeDType::F16, {65536}, all16.data(), 131072},
                             {"e4m3", SafeDType::F8_E4M3, {16, 16}, all8.data(), 256},
                             {"e5m2", SafeDType::F8_E5M2, {256}, all8.data(), 256}});
    // Nothing but the file itself is left in the folder (the temporary file was renamed).
    REQUIRE(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);

    const SafetensorsFile f(path);
    REQUIRE(f.metadata() == std::optional<SafetensorsMetadata>(kPtMetadata));
    std::vector<std::string> names;
    for (const SafetensorsEntry& e : f.entries()) names.push_back(e.name);
    // Widest dtype first, then by name, as HF's writer orders them.
    REQUIRE(names == std::vector<std::string>{"f32", "bf16", "f16", "e4m3", "e5m2"});
    CHECK(f.entry("bf16").shape == std::vector<i64>{256, 256});
    CHECK(f.entry("bf16").dtype == SafeDType::BF16);
    CHECK(f.entry("e4m3").numel() == 256);

    const std::vector<unsigned char> raw = f.read_raw("bf16");
    CHECK(std::memcmp(raw.data(), all16.data(), raw.size()) == 0);
    const std::vector<float> got32 = f.read_f32("f32");
    for (size_t i = 0; i < f32.size(); i++)
        CHECK(std::bit_cast<std::uint32_t>(got32[i]) == std::bit_cast<std::uint32_t>(f32[i]));
    const std::vector<float> bf = f.read_f32("bf16"), hf = f.read_f32("f16");
    i64 bad = 0;
    for (size_t i = 0; i < all16.size(); i++) {
        bad += std::bit_cast<std::uint32_t>(bf[i]) !=
               std::bit_cast<std::uint32_t>(bf16_to_f32(all16[i]));
        const float want = f16_to_f32(all16[i]);  // NaNs: the converter's own bits
        bad += std::bit_cast<std::uint32_t>(hf[i]) != std::bit_cast<std::uint32_t>(want);
        // Exact: narrowing back gives the pattern (every NaN stays a NaN).
        if (!std::isnan(bf[i])) bad += f32_to_bf16(bf[i]) != all16[i];
        if (!std::isnan(hf[i])) bad += f32_to_f16(hf[i]) != all16[i];
    }
    CHECK(bad == 0);
    const std::vector<float> q4 = f.read_f32("e4m3"), q5 = f.read_f32("e5m2");
    for (size_t i = 0; i < 256; i++) {
        CHECK(std::bit_cast<std::uint32_t>(q4[i]) ==
              std::bit_cast<std::uint32_t>(e4m3_to_f32(std::uint8_t(i))));
        CHECK(std::bit_cast<std::uint32_t>(q5[i]) ==
              std::bit_cast<std::uint32_t>(e5m2_to_f32(std::uint8_t(i))));
    }
    // Into the caller's buffer, and the dtype mapping both ways.
    std::vector<float> buf(65536);
    f.read_f32("f16", buf.data(), i64(buf.size()));
    CHECK(std::memcmp(buf.data(), hf.data(), buf.size() * 4) == 0);
    for (DType t : {DType::f32, DType::bf16, DType::f16, DType::e4m3, DType::e5m2})
        CHECK(px_dtype_of(safe_dtype_of(t)) == t);
    for (int i = 0; i < kNumSafeDTypes; i++) {
        const SafeDType t = SafeDType(i);
        CHECK(safe_dtype_from_name(safe_dtype_name(t)) == t);
    }
    CHECK(!safe_dtype_from_name("F128"));
}

TEST_CASE("safetensors: the writer's bytes are HF's library's (safetensors 0.8.0)",
          "[safetensors]") {
    TempDir dir;
    const std::vector<Golden> g = golden_tensors();
    std::vector<SafetensorsData> in = data_of(g);
    const std::string path = dir.file("golden.safetensors");
    write_safetensors(path, in);
    CHECK(get_file(path) == from_hex(kGoldenPt));

    // The order given does not matter: HF sorts.
    std::reverse(in.begin(), in.end());
    write_safetensors(path, in);
    CHECK(get_file(path) == from_hex(kGoldenPt));
    std::shuffle(in.begin(), in.end(), std::mt19937(7));
    write_safetensors(path, in);
    CHECK(get_file(path) == from_hex(kGoldenPt));

    // No metadata: no "__metadata__" key at all.
    write_safetensors(path, data_of({g.begin(), g.begin() + 3}), std::nullopt);
    CHECK(get_file(path) == from_hex(kGoldenNoMetadata));

    // The header's JSON pads to 8 bytes: the data starts aligned.
    const SafetensorsFile f(path);
    CHECK(f.header_bytes() % 8 == 0);
}

TEST_CASE("safetensors: a file read and written back is the same bytes", "[safetensors]") {
    TempDir dir;
    auto rewrite = [&](const std::string& bytes) {
        const std::string in = dir.file("in.safetensors"), out = dir.file("out.safetensors");
        put_file(in, bytes);
        const SafetensorsFile f(in);
        std::vector<std::vector<unsigned char>> keep;
        std::vector<SafetensorsData> data;
        for (const SafetensorsEntry& e : f.entries()) {
            keep.push_back(f.read_raw(e.name));
            data.push_back({e.name, e.dtype, e.shape, keep.back().data(), keep.back().size()});
        }
        write_safetensors(out, data, f.metadata(), SafetensorsOrder::given);
        return get_file(out);
    };
    CHECK(rewrite(from_hex(kGoldenPt)) == from_hex(kGoldenPt));
    CHECK(rewrite(from_hex(kGoldenNoMetadata)) == from_hex(kGoldenNoMetadata));

    // Metadata keys keep the file's order; an order HF would not write is kept too.
    TempDir d2;
    const std::string path = d2.file("x.safetensors");
    const float v[3] = {1.0f, 2.0f, 3.0f};
    const SafetensorsMetadata md = {{"zz", "1"}, {"aa", "\xe2\x80\xa8\x7f/"}, {"format", "pt"}};
    write_safetensors(path,
                      {{"z", SafeDType::F32, {1}, &v[0], 4}, {"a", SafeDType::F32, {2}, &v[1], 8}},
                      md, SafetensorsOrder::given);
    const std::string bytes = get_file(path);
    CHECK(rewrite(bytes) == bytes);
    const SafetensorsFile f(path);
    CHECK(f.metadata() == std::optional<SafetensorsMetadata>(md));
    CHECK(f.entries()[0].name == "z");
    CHECK(f.read_f32("a") == std::vector<float>{2.0f, 3.0f});

    // Empty files: no tensors, and an empty "__metadata__" apart from none.
    write_safetensors(path, {}, std::nullopt);
    CHECK(get_file(path) == st_bytes("{}      "));
    write_safetensors(path, {}, SafetensorsMetadata{});
    CHECK(get_file(path) == st_bytes("{\"__metadata__\":{}}     "));
    CHECK(SafetensorsFile(path).metadata() ==
          std::optional<SafetensorsMetadata>(SafetensorsMetadata{}));
}

TEST_CASE("safetensors: valid files written by others load", "[safetensors]") {
    TempDir dir;
    const std::string path = dir.file("ok.safetensors");
    // Unknown keys of an entry are ignored (the reference does), whitespace is JSON's, zero-size
    // tensors may share an offset, a scalar has shape [].
    put_file(path, st_bytes("{ \"b\" : {\"data_offsets\":[4,4],\"shape\":[0],\"dtype\":\"F16\"},\n"
                            "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],"
                            "\"extra\":{\"x\":[1,[2,{}]],\"y\":null}},"
                            "\"c\":{\"dtype\":\"I8\",\"shape\":[0,5],\"data_offsets\":[4,4]}}\t\r",
                            std::string("\0\0\x80\x3f", 4)));
    const SafetensorsFile f(path);
    CHECK(f.entries().size() == 3);
    CHECK(f.read_f32("s") == std::vector<float>{1.0f});
    CHECK(f.read_f32("b").empty());
    CHECK(!f.metadata());
    read_everything(f);
}

TEST_CASE("safetensors: shards and their index as transformers writes them", "[safetensors]") {
    TempDir dir;
    std::vector<float> v(30);
    for (size_t i = 0; i < v.size(); i++) v[i] = float(i) * 0.5f;
    const std::vector<SafetensorsData> in = {
        {"b.x", SafeDType::F32, {10}, v.data(), 40},
        {"a.y", SafeDType::F32, {6}, v.data(), 24},
        {"big", SafeDType::F32, {30}, v.data(), 120},  // larger than a shard: its own
        {"c", SafeDType::F32, {4}, v.data(), 16},
        {"\xc3\xbc", SafeDType::F32, {2}, v.data(), 8},
    };
    const SafetensorsShards out = write_safetensors_shards(dir.path.string(), in, 64);
    REQUIRE(out.files.size() == 3);
    CHECK(fs::path(out.files[0]).filename() == "model-00001-of-00003.safetensors");
    CHECK(fs::path(out.index).filename() == "model.safetensors.index.json");
    CHECK(get_file(out.index) ==
          "{\n  \"metadata\": {\n    \"total_size\": 208\n  },\n  \"weight_map\": {\n    \"a.y\": "
          "\"model-00002-of-00003.safetensors\",\n    \"b.x\": \"model-00002-of-00003.safetensors"
          "\",\n    \"big\": \"model-00001-of-00003.safetensors\",\n    \"c\": \"model-00003-of-"
          "00003.safetensors\",\n    \"\\u00fc\": \"model-00003-of-00003.safetensors\"\n  }\n}\n");
    CHECK(SafetensorsFile(out.files[1]).metadata() ==
          std::optional<SafetensorsMetadata>(kPtMetadata));

    for (const std::string& p : {out.index, dir.path.string()}) {
        const SafetensorsSet set(p);
        CHECK(set.path() == out.index);
        CHECK(set.files().size() == 3);
        CHECK(set.total_size() == 208u);
        CHECK(set.names() == std::vector<std::string>{"big", "a.y", "b.x", "c", "\xc3\xbc"});
        CHECK(set.file_of("c").path() == out.files[2]);
        std::vector<float> got(30);
        set.read_f32("big", got.data(), 30);
        CHECK(got == v);
        CHECK(set.entry("a.y").shape == std::vector<i64>{6});
        std::vector<float> two(2);
        set.read_raw("\xc3\xbc", two.data(), 8);
        CHECK(two == std::vector<float>{0.0f, 0.5f});
        const std::string msg = thrown<DataError>([&] { set.entry("nope"); });
        CHECK_THAT(msg, Contains(out.index) && Contains("'nope'"));
    }

    // Written again into the same folder, as one file then as two shards: what the earlier
    // writes left is removed (a reader of the folder must find the new set), other files stay.
    put_file(dir.file("model-notes.txt"), "kept");
    put_file(dir.file("other-00001-of-00002.safetensors"), "kept");
    const SafetensorsShards again = write_safetensors_shards(dir.path.string(), in, 1000);
    CHECK(again.index.empty());
    CHECK(!fs::exists(out.index));
    for (const std::string& f : out.files) CHECK(!fs::exists(f));
    CHECK(SafetensorsSet(dir.path.string()).path() == dir.file("model.safetensors"));
    const SafetensorsShards two = write_safetensors_shards(dir.path.string(), in, 200);
    REQUIRE(two.files.size() == 2);
    CHECK(!fs::exists(dir.file("model.safetensors")));
    CHECK(SafetensorsSet(dir.path.string()).files().size() == 2);
    CHECK(fs::exists(dir.file("model-notes.txt")));
    CHECK(fs::exists(dir.file("other-00001-of-00002.safetensors")));

    // One shard: model.safetensors alone, no index, and a set of it.
    TempDir one;
    const SafetensorsShards single = write_safetensors_shards(one.path.string(), in, 1000);
    CHECK(single.files == std::vector<std::string>{one.file("model.safetensors")});
    CHECK(single.index.empty());
    CHECK(!fs::exists(one.file("model.safetensors.index.json")));
    const SafetensorsSet set(one.path.string());
    CHECK(set.names().size() == 5);
    CHECK(!set.total_size());
}

TEST_CASE("safetensors: a bad index or shard set is refused naming the index, shard and tensor",
          "[safetensors]") {
    TempDir dir;
    const float v[4] = {1, 2, 3, 4};
    write_safetensors(dir.file("s1.safetensors"),
                      {{"a", SafeDType::F32, {2}, v, 8}, {"b", SafeDType::F32, {2}, v + 2, 8}});
    write_safetensors(dir.file("s2.safetensors"),
                      {{"c", SafeDType::F32, {1}, v, 4}, {"a", SafeDType::F32, {1}, v, 4}});
    write_safetensors(dir.file("s3.safetensors"), {{"d", SafeDType::F32, {1}, v, 4}});
    const std::string index = dir.file("model.safetensors.index.json");
    auto refused = [&](const std::string& text) {
        put_file(index, text);
        const std::string msg = thrown<DataError>([&] { SafetensorsSet s(index); });
        CHECK_THAT(msg, Contains(index));
        return msg;
    };
    CHECK_THAT(refused(R"({"weight_map": {"a": "s1.safetensors", "b": "gone.safetensors"}})"),
               Contains("'b'") && Contains("gone.safetensors") && Contains("does not exist"));
    CHECK_THAT(refused(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors",
                                          "d": "s1.safetensors"}})"),
               Contains("'d'") && Contains("s1.safetensors") && Contains("has no such tensor"));
    CHECK_THAT(refused(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors",
                                          "c": "s2.safetensors"}})"),
               Contains("'a'") && Contains("s1.safetensors") && Contains("s2.safetensors") &&
                   Contains("two shards"));
    CHECK_THAT(refused(R"({"weight_map": {"a": "s1.safetensors"}})"),
               Contains("'b'") && Contains("does not list"));
    CHECK_THAT(refused(R"({"weight_map": {"a": "s1.safetensors", "a": "s1.safetensors"}})"),
               Contains("'a'") && Contains("twice"));
    CHECK_THAT(refused(R"({"weight_map": {"a": "../s1.safetensors"}})"),
               Contains("'a'") && Contains("not a file beside the index"));
    CHECK_THAT(refused(R"({"weight_map": {"a": 3}})"), Contains("'a'"));
    CHECK_THAT(refused(R"({"metadata": {}, "weight_map": )"), Contains("not valid JSON"));
    CHECK_THAT(refused(R"({"metadata": {"total_size": 12}})"), Contains("no \"weight_map\""));
    CHECK_THAT(refused("[1, 2]"), Contains("not a JSON object"));
    CHECK_THAT(refused(std::string("{\"weight_map\": {}}\0", 19)), Contains("NUL byte"));
    CHECK_THAT(refused(std::string(100, '[')), Contains("nests deeper"));
    // A damaged shard is refused by its own checks, naming the shard.
    put_file(dir.file("s3.safetensors"), st_bytes("{\"d\":{\"dtype\":\"F32\"}}"));
    put_file(index, R"({"weight_map": {"d": "s3.safetensors"}})");
    CHECK_THAT(thrown<DataError>([&] { SafetensorsSet s(index); }),
               Contains(dir.file("s3.safetensors")) && Contains("'d'"));
    CHECK_THAT(thrown<DataError>([&] { SafetensorsSet s(dir.file("none")); }),
               Contains(dir.file("none")));
}

TEST_CASE("safetensors: every malformed file is refused naming the file and the tensor",
          "[safetensors]") {
    TempDir dir;
    const std::string path = dir.file("bad.safetensors");
    // The message of opening `bytes`, which must name the file.
    auto refused = [&](const std::string& bytes) {
        put_file(path, bytes);
        const std::string msg = thrown<DataError>([&] { SafetensorsFile f(path); });
        CHECK_THAT(msg, Contains(path));
        return msg;
    };
    const std::string four(4, '\0'), eight(8, '\0'), twelve(12, '\0');
    auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape,
                    const std::string& offsets) {
        return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
               ",\"data_offsets\":" + offsets + "}";
    };

    SECTION("too short, truncated, absurd or missing headers") {
        CHECK_THAT(refused(""), Contains("is 0 bytes, shorter than the 8-byte"));
        CHECK_THAT(refused(std::string("\x10\0\0", 3)), Contains("is 3 bytes"));
        CHECK_THAT(refused(st_bytes("{}", "", 1000)),
                   Contains("header of 1000 bytes but has only 2") && Contains("truncated"));
        CHECK_THAT(refused(st_bytes("{}", "", u64(1) << 60)),
                   Contains("header of 1152921504606846976 bytes, more than the 100000000"));
        CHECK_THAT(refused(st_bytes("{}", "", ~u64(0))), Contains("more than the 100000000"));
        CHECK_THAT(refused(st_bytes("")), Contains("does not start with '{'"));
        CHECK_THAT(refused(st_bytes(" {}")), Contains("does not start with '{'"));
        CHECK_THAT(refused(st_bytes("[{}]")), Contains("does not start with '{'"));
        // The whole file cut after the header: the tensor's bytes are missing.
        const std::string h = "{" + entry("w", "F32", "[2]", "[0,8]") + "}";
        CHECK_THAT(refused(st_bytes(h, four)), Contains("'w'") && Contains("past the end"));
        CHECK_THAT(refused(from_hex(kGoldenPt).substr(0, 700)),
                   Contains("'wte'") && Contains("past the end"));
    }
    SECTION("invalid JSON") {
        CHECK_THAT(refused(st_bytes("{\"w\":{\"dtype\":\"F32\",")), Contains("not valid JSON"));
        CHECK_THAT(refused(st_bytes("{\"\xff\":{}}")), Contains("not valid JSON"));
        CHECK_THAT(refused(st_bytes("{\"\\ud800\":{}}")), Contains("not valid JSON"));
        CHECK_THAT(refused(st_bytes(std::string("{}\0\0\0\0\0\0", 8))),
                   Contains("NUL byte at byte 10"));
        CHECK_THAT(refused(st_bytes(std::string("{}\0{\"x\":1}", 10))), Contains("NUL byte"));
        CHECK_THAT(refused(st_bytes("{} x")), Contains("not valid JSON"));
        CHECK_THAT(refused(st_bytes("{\"w\":5}")), Contains("'w' as a number"));
        CHECK_THAT(refused(st_bytes("{\"w\":[1]}")), Contains("'w' as an array"));
        CHECK_THAT(refused(st_bytes("{\"__metadata__\":\"pt\"}")),
                   Contains("\"__metadata__\" that is a string"));
        CHECK_THAT(refused(st_bytes("{\"__metadata__\":{\"format\":1}}")),
                   Contains("'format' to a number"));
        CHECK_THAT(refused(st_bytes("{\"__metadata__\":{\"a\":{}}}")), Contains("__metadata__"));
        CHECK_THAT(refused(st_bytes("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}")),
                   Contains("'a' twice"));
        CHECK_THAT(refused(st_bytes("{\"__metadata__\":{},\"__metadata__\":{}}")),
                   Contains("two \"__metadata__\""));
    }
    SECTION("entries that lie about their dtype, shape or offsets") {
        CHECK_THAT(refused(st_bytes("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", four)),
                   Contains("'w' has no \"dtype\""));
        CHECK_THAT(refused(st_bytes("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", four)),
                   Contains("'w' has no \"shape\""));
        CHECK_THAT(refused(st_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", four)),
                   Contains("'w' has no \"data_offsets\""));
        CHECK_THAT(refused(st_bytes("{" + entry("w", "F128", "[1]", "[0,4]") + "}", four)),
                   Contains("'w' has dtype \"F128\", which is no safetensors dtype"));
        CHECK_THAT(
            refused(st_bytes("{\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", four)),
            Contains("'w' has a dtype that is a number"));
        CHECK_THAT(refused(st_bytes("{" + entry("w", "F32", "[-1]", "[0,4]") + "}", four)),
                   Contains("'w'") && Contains("negative"));
        CHECK_THAT(refused(st_bytes("{" + entry("w", "F32", "[1.5]", "[0,4]") + "}", four)),
                   Contains("'w'") && Contains("not an integer"));
        CHECK_THAT(refused(st_bytes("{" + entry("w", "F32", "[\"1\"]", "[0,4]") + "}", four)),
                   Contains("'w'") && Contains("a string"));
        CHECK_THAT(refused(st_bytes("{" + entry("w", "F32", "7", "[0,4]") + "}", four)),
                   Contains("'w' has a shape that is a number"));
        CHECK_THAT(refused(st_bytes("{" + entry("w", "F32", "[2]", "[0,4]") + "}", four)),
                   Contains("'w' has shape [2] of F32, 8 bytes, but data_offsets [0, 4] span 4"));
        CHECK_THAT(refused(st_bytes("{" + entry("w", "F32", "[1]", "[4,0]") + "}", four)),
                   Contains("'w' has data_offsets [4, 0] that end before they begin"));
        CHECK_THAT(refused(st_bytes("{" + entry("w", "F32", "[1]", "[0,4,8]") + "}", four)),
                   Contains("'w'") && Contains("more than 2"));
        CHECK_THAT(refused(st_bytes("{" + entry("w", "F32", "[1]", "[4]") + "}", four)),
                   Contains("'w'") && Contains("1 number(s) in its data_offsets"));
        CHECK_THAT(refused(st_bytes(
                       "{" + entry("w", "F32", "[1]", "[0,18446744073709551616]") + "}", four)),
                   Contains("'w'") && Contains("not an integer"));
        CHECK_THAT(refused(st_bytes(
                       "{" + entry("w", "F32", "[4294967296,4294967296,4294967296]", "[0,4]") + "}",
                       four)),
                   Contains("'w'") && Contains("more bytes than any file"));
        CHECK_THAT(refused(st_bytes("{" + entry("w", "F4", "[3]", "[0,2]") + "}", "xy")),
                   Contains("'w' has 3 elements of F4, which is not a whole number of bytes"));
        CHECK_THAT(refused(st_bytes("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],"
                                    "\"data_offsets\":[0,4]}}",
                                    four)),
                   Contains("'w' has the key \"dtype\" twice"));
        CHECK_THAT(refused(st_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":"
                                    "[0,4],\"x\":" +
                                        std::string(100, '[') + std::string(100, ']') + "}}",
                                    four)),
                   Contains("'w' nests deeper"));
        std::string ones = "1";
        for (int i = 0; i < 1024; i++) ones += ",1";
        CHECK_THAT(
            refused(st_bytes("{" + entry("w", "F32", "[" + ones + "]", "[0,4]") + "}", four)),
            Contains("'w' has a shape of more than 1024 dimensions"));
    }
    SECTION("tensors that overlap, leave holes, or leave bytes over; names given twice") {
        const std::string a8 = entry("a", "F32", "[2]", "[0,8]");
        CHECK_THAT(
            refused(st_bytes("{" + a8 + "," + entry("b", "F32", "[2]", "[4,12]") + "}", twelve)),
            Contains("'b'") && Contains("overlapping tensor 'a'"));
        CHECK_THAT(
            refused(st_bytes("{" + a8 + "," + entry("z", "F32", "[0]", "[4,4]") + "}", eight)),
            Contains("'z'") && Contains("overlapping tensor 'a'"));
        CHECK_THAT(refused(st_bytes("{" + entry("a", "F32", "[1]", "[0,4]") + "," +
                                        entry("b", "F32", "[1]", "[8,12]") + "}",
                                    twelve)),
                   Contains("hole: bytes [4, 8)") && Contains("'b'"));
        CHECK_THAT(refused(st_bytes("{" + entry("b", "F32", "[1]", "[4,8]") + "}", eight)),
                   Contains("hole: bytes [0, 4)") && Contains("'b'"));
        CHECK_THAT(refused(st_bytes("{" + entry("a", "F32", "[1]", "[0,4]") + "}", eight)),
                   Contains("4 bytes after its last tensor"));
        CHECK_THAT(refused(st_bytes("{}", four)), Contains("4 bytes after its last tensor"));
        CHECK_THAT(refused(st_bytes("{" + a8 + "," + a8 + "}", eight)),
                   Contains("names tensor 'a' twice"));
    }
    SECTION("not a regular file, or none") {
        CHECK_THAT(thrown<DataError>([&] { SafetensorsFile f(dir.path.string()); }),
                   Contains(dir.path.string()) && Contains("a folder"));
        CHECK_THAT(thrown<DataError>([&] { SafetensorsFile f(dir.file("none")); }),
                   Contains(dir.file("none")) && Contains("cannot open"));
    }
}

TEST_CASE("safetensors: missing tensors, unconvertible dtypes, wrong buffers, cut files",
          "[safetensors]") {
    TempDir dir;
    const std::string path = dir.file("x.safetensors");
    put_file(path, from_hex(kGoldenPt));
    const SafetensorsFile f(path);
    read_everything(f);
    CHECK_THAT(thrown<DataError>([&] { f.entry("h.0.attn.c_attn.weight"); }),
               Contains(path) && Contains("'h.0.attn.c_attn.weight'") && Contains("10 ("));
    CHECK_THAT(thrown<DataError>([&] { f.read_raw("nope"); }),
               Contains(path) && Contains("'nope'"));
    CHECK_THAT(thrown<DataError>([&] { f.read_f32("step"); }),
               Contains(path) && Contains("'step' is I64"));
    CHECK_THAT(thrown<DataError>([&] { f.read_f32("mask"); }), Contains("'mask' is BOOL"));
    std::vector<float> small(5);
    CHECK_THAT(thrown<Error>([&] { f.read_f32("wte", small.data(), 5); }),
               Contains("'wte'") && Contains("6 elements"));
    CHECK_THAT(thrown<Error>([&] { f.read_raw("wte", small.data(), 20); }),
               Contains("'wte'") && Contains("24 bytes"));
    SafetensorsFile g(dir.file("../" + dir.path.filename().string() + "/x.safetensors"));
    // Cut after it was opened: the read fails cleanly, naming the tensor.
    REQUIRE(::truncate(path.c_str(), 8 + off_t(f.header_bytes()) + 20) == 0);
    CHECK_THAT(thrown<DataError>([&] { f.read_raw("wte"); }),
               Contains(path) && Contains("'wte'") && Contains("truncated"));
    CHECK_THAT(thrown<DataError>([&] { f.read_f32("h.0.ln_1.weight"); }),
               Contains("'h.0.ln_1.weight'") && Contains("truncated"));
    // Moved: the open file still reads what is left.
    SafetensorsFile h(std::move(g));
    CHECK(h.read_raw("step").size() == 8);
    g = std::move(h);
    CHECK(g.read_raw("lm_head.weight").size() == 8);
}

TEST_CASE("safetensors: the writer refuses what it cannot write and leaves no file",
          "[safetensors]") {
    TempDir dir;
    const std::string path = dir.file("w.safetensors");
    const float v[4] = {};
    auto refused = [&](const std::vector<SafetensorsData>& t) {
        const std::string msg = thrown<Error>([&] { write_safetensors(path, t); });
        CHECK_THAT(msg, Contains(path));
        return msg;
    };
    CHECK_THAT(refused({{"w", SafeDType::F32, {3}, v, 8}}),
               Contains("'w' has shape [3] of F32 but 8 bytes"));
    CHECK_THAT(refused({{"w", SafeDType::F32, {-1}, v, 0}}), Contains("'w' has a negative"));
    CHECK_THAT(refused({{"w", SafeDType::F32, {1}, v, 4}, {"w", SafeDType::F32, {1}, v, 4}}),
               Contains("'w' is given twice"));
    CHECK_THAT(refused({{"__metadata__", SafeDType::F32, {1}, v, 4}}), Contains("reserved"));
    CHECK_THAT(refused({{"\xc3", SafeDType::F32, {1}, v, 4}}), Contains("not valid UTF-8"));
    CHECK_THAT(refused({{"w", SafeDType::F4, {3}, v, 1}}), Contains("no whole number of bytes"));
    CHECK_THAT(refused({{"w", SafeDType::F32, {1}, nullptr, 4}}), Contains("'w' has no data"));
    CHECK_THAT(thrown<Error>([&] {
                   write_safetensors(path, {}, SafetensorsMetadata{{"k", "1"}, {"k", "2"}});
               }),
               Contains("'k' is given twice"));
    CHECK_THAT(thrown<Error>([&] { write_safetensors_shards(dir.path.string(), {}, 0); }),
               Contains("0 bytes"));
    CHECK_THAT(
        thrown<Error>([&] { write_safetensors_shards(dir.path.string(), {}, 8, {}, "a/b"); }),
        Contains("'a/b'"));
    CHECK(fs::is_empty(dir.path));
    const std::string nowhere = dir.file("no/such/folder/w.safetensors");
    CHECK_THAT(thrown<StorageError>([&] { write_safetensors(nowhere, {}); }),
               Contains(nowhere) && Contains("cannot create"));
    // A file already there stays whole when a write is refused.
    write_safetensors(path, {{"w", SafeDType::F32, {1}, v, 4}});
    const std::string before = get_file(path);
    refused({{"w", SafeDType::F32, {2}, v, 4}});
    CHECK(get_file(path) == before);
}

TEST_CASE("safetensors: 2000 random mutations of a valid file load or throw px::Error",
          "[safetensors][fuzz]") {
    TempDir dir;
    const std::string path = dir.file("fuzz.safetensors");
    const std::string valid = from_hex(kGoldenPt);
    u64 n = 0;
    std::memcpy(&n, valid.data(), 8);
    std::mt19937_64 rng(20240601);
    auto pick = [&](u64 lo, u64 hi) { return std::uniform_int_distribution<u64>(lo, hi)(rng); };
    const std::string alphabet = "{}[]\",:-.0123456789eE \\FIUB_";
    int loaded = 0, refused = 0;
    for (int it = 0; it < 2000; it++) {
        std::string b = valid;
        const int edits = int(pick(1, 3));
        std::string what;
        for (int e = 0; e < edits; e++) {
            switch (pick(0, 6)) {
                case 0: {  // bit flips anywhere
                    const u64 at = pick(0, b.size() - 1);
                    b[at] = char(b[at] ^ (1 << pick(0, 7)));
                    what += "flip@" + std::to_string(at) + " ";
                    break;
                }
                case 1:  // truncation
                    b.resize(pick(0, b.size()));
                    what += "cut@" + std::to_string(b.size()) + " ";
                    break;
                case 2: {  // a header character replaced by JSON punctuation or a digit
                    const u64 at = pick(8, 8 + n - 1);
                    if (at < b.size()) b[at] = alphabet[pick(0, alphabet.size() - 1)];
                    what += "edit@" + std::to_string(at) + " ";
                    break;
                }
                case 3: {  // the header length replaced
                    const u64 v = pick(0, 3) == 0 ? rng() : n + pick(0, 16) - 8;
                    if (b.size() >= 8) std::memcpy(b.data(), &v, 8);
                    what += "len=" + std::to_string(v) + " ";
                    break;
                }
                case 4: {  // a stretch of the header duplicated (keys twice, nested values)
                    const u64 from = pick(8, 8 + n - 2), len = pick(1, 40);
                    if (from < b.size()) b.insert(from, b.substr(from, len));
                    what += "dup@" + std::to_string(from) + " ";
                    break;
                }
                case 5:  // bytes added at the end
                    b += std::string(pick(1, 16), char(pick(0, 255)));
                    what += "grow ";
                    break;
                default: {  // a digit of an offset or shape changed
                    const u64 at = pick(8, 8 + n - 1);
                    if (at < b.size() && b[at] >= '0' && b[at] <= '9')
                        b[at] = char('0' + pick(0, 9));
                    what += "digit@" + std::to_string(at) + " ";
                    break;
                }
            }
        }
        put_file(path, b);
        try {
            const SafetensorsFile f(path);
            read_everything(f);
            loaded++;
        } catch (const Error&) {
            refused++;
        } catch (const std::exception& e) {
            FAIL("mutation " << it << " (" << what << ") threw a non-px exception: " << e.what());
        }
    }
    INFO("loaded " << loaded << ", refused " << refused);
    CHECK(loaded + refused == 2000);
    CHECK(refused > 1000);  // most mutations break the file
    CHECK(loaded > 0);      // some leave it valid (a flipped data bit)
}
