// choose_python (quicksilver/launch/python.h): the one interpreter rule, over stub
// interpreters in a temporary directory (shell scripts that "import torch" or fail as
// Python does), so no real interpreter is looked at.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "quicksilver/launch/python.h"

namespace qs {
namespace {

namespace fs = std::filesystem;

class ChoosePython : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/qs-python-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An executable stub at dir_/rel: with torch it exits 0; without, it prints Python's
  // traceback ending and exits 1. Each start appends a line to dir_/starts.
  std::string stub(const std::string& rel, bool torch) {
    const fs::path p = dir_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream f(p);
    f << "#!/bin/sh\necho \"$0\" >> '" << (dir_ / "starts").string() << "'\n";
    if (torch) {
      f << "exit 0\n";
    } else {
      f << "echo 'Traceback (most recent call last):' >&2\n"
        << "echo \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n";
    }
    f.close();
    chmod(p.c_str(), 0755);
    return p.string();
  }
  int starts() const {
    std::ifstream f(dir_ / "starts");
    int n = 0;
    for (std::string line; std::getline(f, line);) ++n;
    return n;
  }
  fs::path dir_;
};

TEST_F(ChoosePython, GivenIsUsedAsIs) {
  PythonSearch s;
  s.given = "/no/such/python";
  s.build = stub("build/python3", true);
  s.system = stub("usr/python3", true);
  auto r = choose_python(s);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, "/no/such/python");
  EXPECT_EQ(starts(), 0);
}

TEST_F(ChoosePython, BuildsInterpreterWithoutStartingIt) {
  PythonSearch s;
  s.build = stub("build/python3", true);
  stub("bin/python3", true);
  s.path = (dir_ / "bin").string();
  s.system = stub("usr/python3", true);
  auto r = choose_python(s);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, s.build);
  EXPECT_EQ(starts(), 0);
}

TEST_F(ChoosePython, PathPython3WhenItImportsTorch) {
  stub("bin/python3", true);
  PythonSearch s;
  s.build = (dir_ / "gone/python3").string();  // recorded, since removed
  s.path = "/nonexistent:" + (dir_ / "bin").string();
  s.system = stub("usr/python3", true);
  auto r = choose_python(s);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, (dir_ / "bin/python3").string());
}

TEST_F(ChoosePython, SkipsPathPython3WithoutTorch) {
  stub("bin/python3", false);
  PythonSearch s;
  s.path = (dir_ / "bin").string();
  s.system = stub("usr/python3", true);
  auto r = choose_python(s);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, s.system);
  EXPECT_EQ(starts(), 2);
}

TEST_F(ChoosePython, NoneImportsTorchListsWhatWasTried) {
  stub("bin/python3", false);
  PythonSearch s;
  s.build = (dir_ / "gone/python3").string();
  s.path = (dir_ / "bin").string();
  s.system = (dir_ / "usr/python3").string();  // absent
  auto r = choose_python(s);
  ASSERT_FALSE(r.is_ok());
  const std::string m = r.status().message();
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;  // one line
  EXPECT_NE(m.find("--python: not given"), std::string::npos) << m;
  EXPECT_NE(m.find("the build's (" + s.build + "): no such executable file"), std::string::npos)
      << m;
  EXPECT_NE(m.find("python3 on PATH (" + (dir_ / "bin/python3").string() +
                   "): cannot import torch: ModuleNotFoundError: No module named 'torch'"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(s.system + ": no such executable file"), std::string::npos) << m;
  EXPECT_NE(m.find("pass --python PATH"), std::string::npos) << m;
  EXPECT_NE(m.find("install torch"), std::string::npos) << m;
}

TEST_F(ChoosePython, NoBuildRecordAndNoPython3OnPath) {
  PythonSearch s;
  s.path = "/nonexistent";
  s.system = stub("usr/python3", false);
  auto r = choose_python(s);
  ASSERT_FALSE(r.is_ok());
  const std::string m = r.status().message();
  EXPECT_NE(m.find("the build's: none recorded"), std::string::npos) << m;
  EXPECT_NE(m.find("python3 on PATH: none"), std::string::npos) << m;
  EXPECT_NE(m.find(s.system + ": cannot import torch: ModuleNotFoundError"), std::string::npos)
      << m;
}

TEST_F(ChoosePython, TheSameFileIsStartedOnce) {
  // A fresh Debian: python3 on PATH is /usr/bin/python3.
  stub("bin/python3", false);
  PythonSearch s;
  s.path = (dir_ / "bin").string();
  s.system = (dir_ / "bin/python3").string();
  auto r = choose_python(s);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find(s.system + ": the same as python3 on PATH"),
            std::string::npos)
      << r.status().message();
  EXPECT_EQ(starts(), 1);
}

}  // namespace
}  // namespace qs
