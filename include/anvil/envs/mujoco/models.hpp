#pragma once
/// @file
/// The MJCF models of the manipulation suite, written here from primitive geoms: one
/// table-top scene (a mocap-driven hand with a two-finger gripper) and the objects of each
/// task. Lengths in metres, masses in kilograms. The frame follows MetaWorld v2's: the
/// table top is z = 0, the robot stands at -y and reaches towards +y, objects lie at
/// y = 0.5 .. 1.0. Light header: no MuJoCo, no torch; `scene_xml(task)` assembles a model.
///
/// The hand is a body on three slide joints held to the mocap body `mocap` by a weld
/// constraint (MetaWorld welds the Sawyer's hand to its mocap the same way; an arm adds
/// nothing the policy controls, so there is none). The fingers slide along y under
/// position servos; `tcp` is the point between the fingertips. Contacts are elliptic
/// cones with a high impedance ratio, so grasped objects do not creep.

#include <string>
#include <string_view>

namespace anvil::envs::mujoco {

namespace models {

/// The scene every task shares: options, the table, the mocap, the hand. `%OBJECTS%` is
/// replaced by a task's bodies and `%EXCLUDES%` by the contacts its fixture leaves out (a
/// moving part and its frame touch by design; MuJoCo filters parent-child contacts only
/// below bodies that move).
inline constexpr std::string_view kScene = R"(<mujoco model="anvil-tabletop">
  <compiler angle="radian" inertiafromgeom="true"/>
  <option timestep="0.0025" cone="elliptic" impratio="10"/>
  <size njmax="400" nconmax="120"/>
  <default>
    <geom friction="1 0.005 0.0001" solref="0.01 1" condim="4" rgba="0.6 0.6 0.6 1"/>
    <joint limited="false" damping="0"/>
    <default class="static">
      <geom rgba="0.4 0.35 0.3 1"/>
    </default>
    <default class="pad">
      <geom friction="2 0.01 0.001" rgba="0.1 0.1 0.1 1"/>
    </default>
  </default>
  <worldbody>
    <geom name="table" class="static" type="box" pos="0 0.6 -0.05" size="0.7 0.4 0.05"/>
    <geom name="wall_back" class="static" type="box" pos="0 0.99 0.06" size="0.7 0.01 0.06"/>
    <geom name="wall_left" class="static" type="box" pos="-0.69 0.6 0.06" size="0.01 0.4 0.06"/>
    <geom name="wall_right" class="static" type="box" pos="0.69 0.6 0.06" size="0.01 0.4 0.06"/>
    <body name="mocap" mocap="true" pos="0 0.6 0.2"/>
    <body name="hand" pos="0 0.6 0.2">
      <joint name="hand_x" type="slide" axis="1 0 0"/>
      <joint name="hand_y" type="slide" axis="0 1 0"/>
      <joint name="hand_z" type="slide" axis="0 0 1"/>
      <geom name="palm" type="box" size="0.02 0.03 0.01" mass="0.5" rgba="0.2 0.3 0.8 1"/>
      <site name="tcp" pos="0 0 -0.045" size="0.005"/>
      <body name="finger_r" pos="0 -0.05 -0.035">
        <joint name="finger_r" type="slide" axis="0 1 0" limited="true" range="0 0.045" damping="4"/>
        <geom name="pad_r" class="pad" type="box" size="0.01 0.005 0.02" mass="0.02"/>
        <site name="tip_r" pos="0 0 -0.01" size="0.004"/>
      </body>
      <body name="finger_l" pos="0 0.05 -0.035">
        <joint name="finger_l" type="slide" axis="0 -1 0" limited="true" range="0 0.045" damping="4"/>
        <geom name="pad_l" class="pad" type="box" size="0.01 0.005 0.02" mass="0.02"/>
        <site name="tip_l" pos="0 0 -0.01" size="0.004"/>
      </body>
    </body>
%OBJECTS%
  </worldbody>
  <contact>%EXCLUDES%
  </contact>
  <equality>
    <weld body1="mocap" body2="hand" solref="0.02 1"/>
  </equality>
  <actuator>
    <position name="grip_r" joint="finger_r" kp="200" ctrllimited="true" ctrlrange="0 0.045"
              forcelimited="true" forcerange="-10 10"/>
    <position name="grip_l" joint="finger_l" kp="200" ctrllimited="true" ctrlrange="0 0.045"
              forcelimited="true" forcerange="-10 10"/>
  </actuator>
</mujoco>
)";

/// A puck (reach: a distractor; push, pick-place: the object), free on the table: a
/// cylinder 4 cm across and 4 cm tall, 100 g.
inline constexpr std::string_view kPuck = R"(
    <body name="object" pos="0 0.6 0.02">
      <freejoint name="object"/>
      <geom name="object" type="cylinder" size="0.02 0.02" mass="0.1" rgba="0.8 0.3 0.2 1"/>
      <site name="object" pos="0 0 0" size="0.005"/>
    </body>)";

/// A cabinet door on a vertical hinge at its left edge that opens towards the robot
/// (negative angles) up to a stop at 1.75 rad (100 degrees), with a horizontal bar handle
/// standing 7 cm off its face near the right edge: the body `door` is the frame, placed per
/// episode. The stop lies inside door-open's success band (the handle within 8 cm of its
/// place at 90 degrees in x: 76-106 degrees), where MetaWorld's reward for the angle is
/// full from 91 degrees: a door flung against a stop beyond the band (2 rad, before) earned
/// 8-10 a step without success, and SAC settled there.
inline constexpr std::string_view kDoor = R"(
    <body name="door" pos="0.05 0.9 0.15">
      <geom class="static" type="box" pos="-0.204 0 0" size="0.016 0.106 0.15"/>
      <geom class="static" type="box" pos="0.204 0 0" size="0.016 0.106 0.15"/>
      <geom class="static" type="box" pos="0 0 0.138" size="0.188 0.106 0.012"/>
      <geom class="static" type="box" pos="0 0.094 0" size="0.188 0.012 0.126"/>
      <body name="door_leaf" pos="-0.185 -0.1 0">
        <joint name="door_hinge" type="hinge" axis="0 0 1" limited="true" range="-1.75 0" damping="0.5"
               armature="0.01"/>
        <geom name="door_leaf" type="box" pos="0.185 0 0" size="0.18 0.01 0.12" mass="1"
              rgba="0.55 0.4 0.25 1"/>
        <geom name="handle" type="capsule" fromto="0.25 -0.08 0 0.35 -0.08 0" size="0.01" mass="0.05"
              rgba="0.8 0.8 0.8 1"/>
        <geom type="capsule" fromto="0.25 -0.01 0 0.25 -0.08 0" size="0.008" mass="0.02"/>
        <geom type="capsule" fromto="0.35 -0.01 0 0.35 -0.08 0" size="0.008" mass="0.02"/>
        <site name="object" pos="0.3 -0.08 0" size="0.005"/>
      </body>
    </body>)";

inline constexpr std::string_view kDoorExcludes = R"(
    <exclude body1="door" body2="door_leaf"/>)";

/// A drawer in a fixed case (its front at y = case - 0.1), sliding 17 cm towards the
/// robot (negative positions), with a horizontal bar handle 5 cm in front of its face.
inline constexpr std::string_view kDrawer = R"(
    <body name="drawer_case" pos="0 0.9 0">
      <geom class="static" type="box" pos="-0.115 0 0.085" size="0.01 0.1 0.085"/>
      <geom class="static" type="box" pos="0.115 0 0.085" size="0.01 0.1 0.085"/>
      <geom class="static" type="box" pos="0 0.095 0.085" size="0.105 0.005 0.085"/>
      <geom class="static" type="box" pos="0 0 0.165" size="0.125 0.1 0.005"/>
      <geom class="static" type="box" pos="0 0 0.005" size="0.105 0.1 0.005"/>
      <body name="drawer" pos="0 -0.01 0.09">
        <joint name="drawer_slide" type="slide" axis="0 1 0" limited="true" range="-0.17 0" damping="2"/>
        <geom type="box" pos="0 0 -0.07" size="0.1 0.09 0.005" mass="0.3" rgba="0.55 0.4 0.25 1"/>
        <geom type="box" pos="-0.095 0 -0.035" size="0.005 0.09 0.035" mass="0.1" rgba="0.55 0.4 0.25 1"/>
        <geom type="box" pos="0.095 0 -0.035" size="0.005 0.09 0.035" mass="0.1" rgba="0.55 0.4 0.25 1"/>
        <geom type="box" pos="0 0.085 -0.035" size="0.1 0.005 0.035" mass="0.1" rgba="0.55 0.4 0.25 1"/>
        <geom name="drawer_front" type="box" pos="0 -0.095 -0.02" size="0.105 0.005 0.045" mass="0.1"
              rgba="0.55 0.4 0.25 1"/>
        <geom name="handle" type="capsule" fromto="-0.05 -0.15 0 0.05 -0.15 0" size="0.009" mass="0.02"
              rgba="0.8 0.8 0.8 1"/>
        <geom type="capsule" fromto="-0.05 -0.1 0 -0.05 -0.15 0" size="0.007" mass="0.01"/>
        <geom type="capsule" fromto="0.05 -0.1 0 0.05 -0.15 0" size="0.007" mass="0.01"/>
        <site name="object" pos="0 -0.15 0" size="0.005"/>
      </body>
    </body>)";

inline constexpr std::string_view kDrawerExcludes = R"(
    <exclude body1="drawer_case" body2="drawer"/>)";

/// A button on top of a box, pressed down from above: 4 cm of travel on a spring.
inline constexpr std::string_view kButton = R"(
    <body name="button_box" pos="0 0.85 0">
      <geom class="static" type="box" pos="0 0 0.1" size="0.06 0.06 0.1"/>
      <body name="button" pos="0 0 0.26">
        <joint name="button_slide" type="slide" axis="0 0 1" limited="true" range="-0.04 0" damping="1"
               stiffness="40"/>
        <geom name="button" type="cylinder" size="0.03 0.02" mass="0.01" rgba="0.8 0.1 0.1 1"/>
        <site name="object" pos="0 0 0.02" size="0.005"/>
      </body>
    </body>)";

inline constexpr std::string_view kButtonExcludes = R"(
    <exclude body1="button_box" body2="button"/>)";

/// A square peg (3 x 3 x 24 cm, lying along x) and a block with a 6 x 6 cm tunnel along x,
/// its entrance facing +x at height 0.13: the peg goes in sideways.
inline constexpr std::string_view kPegAndHole = R"(
    <body name="object" pos="0.1 0.6 0.015">
      <freejoint name="object"/>
      <geom name="peg" type="box" size="0.12 0.015 0.015" mass="0.1" rgba="0.3 0.7 0.3 1"/>
      <site name="object" pos="0.03 0 0" size="0.005"/>
      <site name="peg_head" pos="-0.12 0 0" size="0.005"/>
    </body>
    <body name="hole_block" pos="-0.3 0.6 0">
      <geom class="static" type="box" pos="0 0 0.05" size="0.1 0.09 0.05"/>
      <geom class="static" type="box" pos="0 0 0.175" size="0.1 0.09 0.015"/>
      <geom class="static" type="box" pos="0 -0.06 0.13" size="0.1 0.03 0.03"/>
      <geom class="static" type="box" pos="0 0.06 0.13" size="0.1 0.03 0.03"/>
    </body>)";

/// A window: a frame and a pane sliding 20 cm along x, with a vertical bar handle 7.5 cm in
/// front of the pane.
inline constexpr std::string_view kWindow = R"(
    <body name="window" pos="0 0.8 0.16">
      <geom class="static" type="box" pos="-0.23 0 0" size="0.01 0.03 0.16"/>
      <geom class="static" type="box" pos="0.23 0 0" size="0.01 0.03 0.16"/>
      <geom class="static" type="box" pos="0 0 0.15" size="0.24 0.03 0.01"/>
      <geom class="static" type="box" pos="0 0 -0.15" size="0.24 0.03 0.01"/>
      <geom class="static" type="box" pos="0.11 0.015 0" size="0.11 0.005 0.14" rgba="0.7 0.8 0.9 0.5"/>
      <body name="pane" pos="-0.11 -0.015 0">
        <joint name="window_slide" type="slide" axis="1 0 0" limited="true" range="0 0.2" damping="2"/>
        <geom name="pane" type="box" size="0.11 0.005 0.14" mass="0.5" rgba="0.7 0.8 0.9 0.5"/>
        <geom name="handle" type="capsule" fromto="-0.04 -0.075 -0.05 -0.04 -0.075 0.05" size="0.008"
              mass="0.02" rgba="0.8 0.8 0.8 1"/>
        <geom type="capsule" fromto="-0.04 -0.005 0.05 -0.04 -0.075 0.05" size="0.006" mass="0.01"/>
        <geom type="capsule" fromto="-0.04 -0.005 -0.05 -0.04 -0.075 -0.05" size="0.006" mass="0.01"/>
        <site name="object" pos="-0.04 -0.075 0" size="0.005"/>
      </body>
    </body>)";

inline constexpr std::string_view kWindowExcludes = R"(
    <exclude body1="window" body2="pane"/>)";

}  // namespace models

}  // namespace anvil::envs::mujoco
